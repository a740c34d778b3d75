"""On a GPU: channels-last outputs made in one step (round 22b: ``cupy.ndarray(shape, dtype, cupy.cuda.alloc(n),
strides)`` in act_kernels, bn_nhwc and the global-average pooling, where a C-ordered NHWC array was made and
transposed) are the same arrays: same shape, strides and values, bit for bit, as the two-step allocation's.  A
channels-last ResNet-20 (float32, and bfloat16 autocast) trains three SGD steps from one start both ways (after a
warm-up run): every parameter and gradient bit-identical, the same launches per step; and the one-step arrays are
real CuPy arrays (C-contiguity flag, base None, 512-byte aligned pool blocks, freed back to the pool)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as M  # noqa: E402
from minidnn.backend.cuda import bn_nhwc, workspace  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

_ONE = workspace.empty_strided
_RECYCLE = workspace.RECYCLE[0]


def _two_step(cp_, spec, dtype):
    shape, strides, _ = spec
    order = sorted(range(len(shape)), key=lambda i: -strides[i])
    return cp_.empty(tuple(shape[i] for i in order), dtype).transpose(tuple(order.index(i) for i in range(len(shape))))


def _use(fn):
    workspace.empty_strided = fn
    workspace.RECYCLE[0] = fn is _ONE and _RECYCLE     # the two-step arrays really made, not kept ones reused


@pytest.fixture(autouse=True)
def _restore():
    """Bit comparisons on the deterministic filter-gradient kernels (split-K float atomics differ run to run;
    tests/conftest.py restores the flag)."""
    mdn.backends.cudnn.deterministic = True
    yield
    _use(_ONE)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
def test_the_one_step_array_is_the_two_step_ones(dtype):
    dtype = mdn.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    bits = np.uint16 if dtype.itemsize == 2 else np.uint32      # the placement of every element, by its bits
    for mem, back in (((2, 5, 7, 16), (0, 3, 1, 2)), ((3, 1, 1, 8), (0, 3, 1, 2)), ((2, 3, 4, 5, 6), (0, 4, 1, 2, 3)),
                      ((4, 9, 3), (0, 2, 1))):
        spec = bn_nhwc.strided_spec(mem, back, dtype)
        one, two = _ONE(cp, spec, dtype), _two_step(cp, spec, dtype)
        assert one.shape == two.shape and one.strides == two.strides and one.dtype == two.dtype
        assert one.flags.c_contiguous == two.flags.c_contiguous and one.base is None and one.data.ptr % 512 == 0
        src = cp.asarray(np.arange(np.prod(mem)).reshape(mem).astype(bits))
        one.view(bits)[...] = src.transpose(back)
        two.view(bits)[...] = src.transpose(back)
        assert cp.array_equal(cp.ascontiguousarray(one.view(bits).transpose(tuple(np.argsort(back)))), src)
        assert cp.asnumpy(cp.ascontiguousarray(one.view(bits))).tobytes() == \
            cp.asnumpy(cp.ascontiguousarray(two.view(bits))).tobytes()
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    a = _ONE(cp, bn_nhwc.strided_spec((8, 32, 32, 64), (0, 3, 1, 2), np.float32), np.dtype(np.float32))
    assert pool.used_bytes() >= before + a.nbytes
    del a
    assert pool.used_bytes() == before


@pytest.mark.parametrize("amp", [None, "bfloat16"])
def test_channels_last_resnet20_steps_bit_identical_to_the_two_step_allocation(amp):
    amp = getattr(mdn, amp) if amp else None
    got = {}
    for name, fn in (("warm-up", _ONE), ("one", _ONE), ("two", _two_step)):    # (a signature's first backward
                                                                                # takes the full path: warm all up)
        _use(fn)
        mdn.manual_seed(0)
        m = M.resnet20(num_classes=10).to("cuda").to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(16, 3, 32, 32).to("cuda").to(memory_format=mdn.channels_last)
        y = mdn.randint(0, 10, (16,)).to("cuda")
        res, launches = [], []
        for _ in range(3):
            n0 = L.launch_count()
            with mdn.autocast("cuda", dtype=amp or mdn.bfloat16, enabled=amp is not None):
                loss = mdn.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            launches.append(L.launch_count() - n0)
            res.append([cp.asnumpy(p.data).tobytes() for p in m.parameters()]
                       + [cp.asnumpy(p.grad.data).tobytes() for p in m.parameters()] + [float(loss.item())])
        got[name] = (res, launches, [p.grad.stride() for p in m.parameters()])
    assert got["one"][0] == got["two"][0]
    assert got["one"][1] == got["two"][1] and got["one"][2] == got["two"][2]

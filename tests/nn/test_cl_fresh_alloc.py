"""Channels-last outputs made in one step (round 22b): act_kernels', bn_nhwc's and the global-average pooling's
settled calls allocate a channels-last output as ONE CuPy array of the channels-first shape with channels-last
strides on a pool block (``cupy.ndarray(shape, dtype, cupy.cuda.alloc(nbytes), strides)``) where they made a
C-ordered NHWC array and transposed it.  Checked on the fake CuPy: the same shape, strides, dtype and alignment as the
two-step allocation for every rank, order and dtype; a whole channels-last training step records the same launches
either way (pointers read as 0) and makes none of those transposes."""
import itertools
import pathlib
import sys
import textwrap

import numpy as np
import pytest

from minidnn.backend.cuda.bn_nhwc import strided_spec
from minidnn.backend.cuda.workspace import empty_strided

from ._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _fake():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import record_launches as R
    finally:
        sys.path.pop(0)
    return R._fake_cupy()         # the fake module alone (not installed into minidnn)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.float64])
def test_one_step_allocation_has_the_two_step_ones_layout(dtype):
    cp = _fake()
    n = 0
    for nd in (3, 4, 5):
        for shape in itertools.product(*[(1, 2, 3)] * nd):
            if nd == 5 and 3 in shape[2:]:
                continue
            perm = (0, *range(2, nd), 1)
            back = (0, nd - 1, *range(1, nd - 1))
            mem = tuple(shape[i] for i in perm)
            two = cp.empty(mem, dtype).transpose(back)
            spec = strided_spec(mem, back, dtype)
            one = empty_strided(cp, spec, np.dtype(dtype))
            assert type(one) is type(two) and one.shape == two.shape == shape and one.strides == two.strides
            assert one.dtype == two.dtype and one.flags.c_contiguous == two.flags.c_contiguous
            assert one.__array_interface__["data"][0] % 512 == 0
            assert spec[2] == two.nbytes
            np.asarray(one)[...] = 7          # writable, and all of it lies inside its block
            n += 1
    assert n > 150
    assert strided_spec((2, 3, 4, 5), None, np.float32) is None


_SCRIPT = textwrap.dedent("""
    import json, sys, collections, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    R._zero_pointers(fakecp, L)
    warnings.filterwarnings("ignore")
    import types
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    fakecp.cuda.Stream = types.SimpleNamespace
    import minidnn as mdn
    import minidnn.models as M
    from minidnn.backend.cuda import workspace
    workspace.RECYCLE[0] = False     # every output allocated (kept outputs would skip the allocation under test)

    def two_step(cp, spec, dtype):      # the allocation before round 22b: NHWC, then the channels-first view
        transposes["two_step"] += 1
        shape, strides, _ = spec
        order = sorted(range(len(shape)), key=lambda i: -strides[i])
        mem = tuple(shape[i] for i in order)
        return cp.empty(mem, dtype).transpose(tuple(order.index(i) for i in range(len(shape))))

    transposes = collections.Counter()
    real_t = fakecp.ndarray.transpose
    def counted_t(self, *axes):
        f = sys._getframe(1).f_code.co_filename
        transposes[f.rsplit("/", 1)[-1]] += 1
        return real_t(self, *axes)
    fakecp.ndarray.transpose = counted_t

    def one_step(cp, spec, dtype, real=workspace.empty_strided):
        transposes["one_step"] += 1
        return real(cp, spec, dtype)
    recs = R.record_packed(L, [], other="cupy")
    out = {{}}
    for model, amp in (("resnet20", None), ("resnet20", mdn.bfloat16), ("mobilenet", mdn.bfloat16)):
        runs = []
        for one in (True, False):
            workspace.empty_strided = one_step if one else two_step
            mdn.manual_seed(0)
            m = (M.resnet20(num_classes=10) if model == "resnet20" else M.MobileNetSmall(num_classes=10, in_channels=3))
            m = m.to("cuda").to(memory_format=mdn.channels_last)
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            x = mdn.randn(4, 3, 16, 16).to("cuda").to(memory_format=mdn.channels_last)
            y = mdn.randint(0, 10, (4,)).to("cuda")
            def step():
                with mdn.autocast("cuda", dtype=amp or mdn.bfloat16, enabled=amp is not None):
                    loss = mdn.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            for i in range(3):
                recs.clear()
                transposes.clear()
                step()
            layouts = [(tuple(p.grad.shape), p.grad.stride(), p.stride()) for p in m.parameters()]
            runs.append((json.dumps(recs), layouts, dict(transposes)))
        (r1, l1, t1), (r2, l2, t2) = runs
        ours = ("act_kernels.py", "bn_nhwc.py", "pool_kernels.py", "workspace.py", "conv_igemm.py")
        out[model + str(amp)] = [r1 == r2, len(json.loads(r1)), l1 == l2, sum(v for k, v in t1.items() if k in ours),
                                 t1.get("one_step", 0), t2.get("two_step", 0)]
    print("RESULT" + json.dumps(out))
""")


def test_a_channels_last_step_records_the_same_launches_without_the_transposes():
    got = run_fake_script(_SCRIPT, ROOT)
    for name, (same, n, same_layouts, transposes, one_step, two_step) in got.items():
        assert same and n > 50 and same_layouts, name
        assert transposes == 0 and one_step == two_step > 25, (name, transposes, one_step, two_step)

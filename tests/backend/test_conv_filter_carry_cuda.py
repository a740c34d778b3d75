"""On a GPU: backward data reading the forward's KRSC filter copy through WKRSC=1 (backend.convolution_filter_carry,
nn's ConvForward; docs/host_overhead.md round 12) gives the bits of backward data through its own CRSK copy -- both
B loaders fill the same (k, n) elements of every slice and the multiply reads B only through BS(stage, k, n) --
over NCHW fp32 strict / TF32 / bfloat16, stride 1 and 2 (the residue classes), groups 1 and 2; the forward's result
is the same with the copy kept; a carry of another filter is not read; the nn path (a ResNet block, forward and
backward) gives the same gradients with the carry -- and with the x carry (CARRY_X) -- on and off, with fewer
launches on.  The launches themselves are checked on the CPU too (test_conv_filter_carry.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend import (  # noqa: E402
    ConvolutionDescriptor,
    convolution_backward_data,
    convolution_forward,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.convolution import convolution_filter_carry  # noqa: E402
from minidnn.backend.cuda import conv_filter_keep  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402

# (N, C, H, W, K, R, S, pad, stride, groups): every one >= 2^25 multiply-adds, so staged (NCHW -> VEC loader)
SHAPES = [(32, 16, 32, 32, 16, 3, 3, 1, 1, 1),       # ResNet-20 stage 1
          (64, 16, 32, 32, 32, 3, 3, 1, 2, 1),       # stride 2: backward data's residue classes
          (32, 32, 16, 16, 32, 3, 3, 1, 1, 2),       # groups 2
          (64, 32, 32, 32, 64, 3, 3, 1, 2, 2),       # stride 2, groups 2
          (16, 48, 17, 15, 40, 5, 5, 2, 1, 1)]       # 5x5, ragged against every tile


@pytest.fixture(autouse=True)
def _no_kept_filters(monkeypatch):
    """The carry's launches counted alone: the kept filter copies (conv_filter_keep, session 16) take the forward's
    filter copy away from the second call on, and the twins' shadows an x staging, which these counts do not expect
    (their own tests: tests/backend/test_conv_filter_keep.py, tests/nn/test_twin_nhwc.py and their cuda twins)."""
    monkeypatch.setattr(conv_filter_keep, "KEEP", [False])
    monkeypatch.setattr(N, "TWIN_NHWC", [False])    # (a shadow taken is one x staging fewer: test_twin_nhwc*)


def _bits(a):
    a = cp.ascontiguousarray(a)
    return a.view(cp.uint32 if a.itemsize == 4 else cp.uint16)


@pytest.fixture(params=["fp32", "tf32", "bfloat16"])
def mode(request):
    old = mdn.backends.cudnn.allow_tf32
    mdn.backends.cudnn.allow_tf32 = request.param == "tf32"
    yield request.param
    mdn.backends.cudnn.allow_tf32 = old


def _arrays(shape, mode, seed=0):
    dt = pytest.importorskip("ml_dtypes").bfloat16 if mode == "bfloat16" else np.float32
    n, c, h, w, k, r, s, pad, stride, groups = shape
    desc = ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), groups)
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((n, c, h, w)).astype(dt))
    wt = cp.asarray(rng.standard_normal((k, c // groups, r, s)).astype(dt))
    p = make_problem("t", x.shape, wt.shape, desc, np.dtype(dt).name)
    dy = cp.asarray(rng.standard_normal(p.y_shape).astype(dt))
    return desc, p, x, wt, dy


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward_data_through_the_carried_copy_gives_the_same_bits(shape, mode):
    desc, p, x, w, dy = _arrays(shape, mode, SHAPES.index(shape))
    if mode == "bfloat16" and (p.Cg % 8 or p.Kg % 8):
        pytest.skip("16-bit vectors need 8 channels per group")
    assert K._stageable(0, p) and K._stageable(1, p)
    h = mdn.backend.handle.configured_default_handle(x)
    y_ref = convolution_forward(h, x, w, desc)
    dx_ref = convolution_backward_data(h, w, dy, desc, x.shape)              # compiles, plans
    n0 = L.launch_count()
    dx_ref = convolution_backward_data(h, w, dy, desc, x.shape)
    n_ref = L.launch_count() - n0
    for _ in range(2):                                                       # the second time: settled calls
        carry = convolution_filter_carry()
        with carry:
            y = convolution_forward(h, x, w, desc)
        assert carry.krsc is not None and carry.krsc.shape == (p.K, *p.kernel, p.Cg)
        assert cp.array_equal(_bits(carry.krsc), _bits(cp.ascontiguousarray(cp.moveaxis(w, 1, -1))))
        assert cp.array_equal(_bits(y), _bits(y_ref))
        n0 = L.launch_count()
        with carry:
            dx = convolution_backward_data(h, w, dy, desc, x.shape)
        assert L.launch_count() - n0 == n_ref - 1                           # no CRSK copy
        assert cp.array_equal(_bits(dx), _bits(dx_ref)), f"{shape} {mode}"
    assert any(getattr(c, "wmode", None) == "carried" and c.p == p for c in K._calls.values())   # (other calls:
    #                                                      conv_pointwise's GemmCall, from another test, has no wmode)
    # another filter's copy is not read (the key is the filter array itself)
    other = cp.ascontiguousarray(w[::-1])
    with carry:
        dx_other = convolution_backward_data(h, other, dy, desc, x.shape)
    assert cp.array_equal(_bits(dx_other), _bits(convolution_backward_data(h, other, dy, desc, x.shape)))


@pytest.mark.parametrize("switch,mode", [("CARRY_FILTER", "fp32"), ("CARRY_FILTER", "tf32"), ("CARRY_X", "fp32"),
                                         ("CARRY_X", "tf32"), ("CARRY_X", "bf16")])
@pytest.mark.parametrize("stride,planes", [(1, 16), (2, 32)])
def test_a_resnet_block_has_the_same_gradients_with_the_carry_on_and_off(stride, planes, switch, mode):
    """The nn path with one carry switched on and off: the same gradients, two launches fewer a block -- CARRY_FILTER:
    conv1 and conv2 (3x3) carry their KRSC filter copy to backward data, the 1x1 shortcut never copies its filter;
    CARRY_X (session 8): their forward's NHWC copy of x to the filter gradient, the 1x1 shortcut is not staged."""
    from minidnn.models import BasicBlock
    mdn.manual_seed(3)
    block = BasicBlock(16, planes, stride).to("cuda")
    xa = np.random.default_rng(5).standard_normal((64, 16, 32, 32)).astype(np.float32)
    runs = {}
    flag = getattr(C, switch)
    old, old_tf32 = flag[0], mdn.backends.cudnn.allow_tf32
    mdn.backends.cudnn.allow_tf32 = mode == "tf32"
    try:
        for on in (False, True, False, True):      # the second run of each: settled calls
            flag[0] = on
            block.zero_grad()
            x = mdn.tensor(xa, device="cuda", requires_grad=True)
            n0 = L.launch_count()
            with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=mode == "bf16"):
                out = block(x)
            out.float().backward(mdn.ones_like(out.float()))
            launches = L.launch_count() - n0
            grads = [cp.asnumpy(_bits(x.grad.data))] + [cp.asnumpy(_bits(q.grad.data)) for q in block.parameters()]
            runs[on] = (grads, launches)
    finally:
        flag[0], mdn.backends.cudnn.allow_tf32 = old, old_tf32
    (g_off, n_off), (g_on, n_on) = runs[False], runs[True]
    assert len(g_on) == len(g_off) > 3
    for a, b in zip(g_off, g_on):
        assert np.array_equal(a, b)
    assert n_on == n_off - 2

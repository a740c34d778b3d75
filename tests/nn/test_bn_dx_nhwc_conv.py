"""The convolution-side change that batch norm's channels-last dx (nn/_functions/norm.py ``DX_NHWC``, docs/fusion.md)
needs, as a stand-in the tests install: an NCHW convolution (x channels-first in memory) given a channels-last dy
returns its dx channels-first, as x -- its settled backward data runs as an NCHW-format call on dy's channels-first
view (the 16-byte loader reads dy's NHWC memory as it is) and allocates dx in the call's format.  Without it the
backward data runs as an NHWC call and returns dx channels-last, which the batch norm before it copies back
(DX_NHWC stays off by default until nn/_functions/conv.py and backend/convolution.py do this themselves; then this
module goes).  The tests: the stand-in alone changes no launch (tests/nn/test_bn_dx_nhwc.py) and, on a GPU, no
bit (test_bn_dx_nhwc_cuda.py)."""
from minidnn.backend import convolution as BC
from minidnn.backend.layout import TensorFormat
from minidnn.nn._functions import conv as C


def _settle(direction, handle, a1, a2, conv_desc, other_shape=None, format=None, dw_dtype=None):
    s = BC.settle_convolution(direction, handle, a1, a2, conv_desc, other_shape, format, dw_dtype)
    if s is not None and direction == 1 and s.fmt is TensorFormat.NCHW and s.cl:
        s.cl, s.plain = False, True         # dx in the call's format (x's), whatever dy's memory order
    return s


def _settle_pair(self, x, w, gy, need, h, dw_dtype, x_shape, w_shape):
    dy_last = C._channels_last(gy.data) and self.nhwc        # an NHWC call only where x is channels-last too
    data = filt = None
    if need[0]:
        dya, shape = (C._last(gy.data), C._last_shape(x_shape)) if dy_last else (gy.data, tuple(x_shape))
        data = C.settle_convolution(1, h, w.data, dya, self.desc, shape, "NHWC" if dy_last else None)
        if data is None:
            return None
    if need[1]:
        filt = C.settle_convolution(2, h, C._last(x.data) if dy_last else x.data,
                                    C._last(gy.data) if dy_last else gy.data, self.desc, tuple(w_shape),
                                    "NHWC" if dy_last else None, dw_dtype)
        if filt is None:
            return None
    return data, filt, dy_last


def install(setattr=setattr):
    """Installs the stand-in (``setattr``: pytest's monkeypatch.setattr to undo it after the test)."""
    setattr(C, "settle_convolution", _settle)
    setattr(C._SeenConv, "_settle_pair", _settle_pair)

"""A convolution whose bias alone wants a gradient (frozen weight, input without grad) on a seen GPU signature, under
tools/record_launches.py's fake CuPy in a subprocess: every call's backward returns db (the settled backward pair
read x or w, which the node had not saved: an AttributeError on the settled signature's calls, session 11).  The
values on a GPU: tests/nn/test_first_call_repro_cuda.py."""
import pathlib
import textwrap

from tests.nn._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    res = {{}}
    for name, xs, ws in (("conv2d", (3, 4, 6, 5), (7, 4, 3, 3)), ("conv1d", (2, 3, 9), (5, 3, 2))):
        op = getattr(F, name)
        x = mdn.Tensor._from_array(fakecp.asarray(np.ones(xs, np.float32)))
        w = mdn.Tensor._from_array(fakecp.asarray(np.ones(ws, np.float32)))
        b = mdn.Tensor._from_array(fakecp.asarray(np.zeros(ws[0], np.float32)))
        b.requires_grad = True
        shapes = []
        for _ in range(3):
            b.grad = None
            y = op(x, w, b)
            y.backward(mdn.Tensor._from_array(fakecp.asarray(np.ones(y.shape, np.float32))))
            shapes.append(list(b.grad.shape))  # (the fake runs no kernel: values on a GPU)
        res[name] = [shapes, len(C._FAST_CONV) > 0]
    print("RESULT" + json.dumps(res))
""")


def test_bias_only_gradient_on_seen_signatures():
    res = run_fake_script(_SCRIPT, ROOT)
    # three calls each with a (C,) db, the signature settled (the fast path taken)
    assert res["conv2d"] == [[[7]] * 3, True]
    assert res["conv1d"] == [[[5]] * 3, True]

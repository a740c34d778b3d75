"""Training steps of the example models on outputs made on reused pool memory (backend/cuda/workspace.py
``fresh``, session 14), under tools/record_launches.py's fake CuPy (NumPy memory: real addresses): no array handed
out covers memory a live array handed out before still covers, and every step records the same launches with the
reuse on and off (NCHW and channels-last, float32 and bfloat16 autocast).  The bits on a GPU:
test_fresh_outputs_cuda.py."""
import pathlib
import textwrap

from ._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_STEPS = textwrap.dedent("""
    import json, sys, collections, warnings, weakref
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    warnings.filterwarnings("ignore")
    import types
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    fakecp.cuda.Stream = types.SimpleNamespace
    import minidnn as mdn
    import minidnn.models as M
    from minidnn.backend.cuda import workspace as W

    live = []               # (weakref to every array fresh handed out, its memory span)
    overlaps = collections.Counter()
    handed = collections.Counter()

    def span(a):
        lo = a.__array_interface__["data"][0]
        return lo, lo + a.nbytes

    def check(arrays, tag):
        live[:] = [(r, s) for r, s in live if r() is not None]
        for a in arrays:
            lo, hi = span(a)
            for r, (l2, h2) in live:
                if r() is not a and lo < h2 and l2 < hi:
                    overlaps[tag] += 1
            handed[tag] += 1
        for a in arrays:
            live.append((weakref.ref(a), span(a)))

    real_fresh, real_pair = W.fresh, W.fresh_pair
    def fresh(cp, dev, tag, *a, **k):
        out = real_fresh(cp, dev, tag, *a, **k)
        check([out], tag)
        return out
    def fresh_pair(cp, dev, tag, *a, **k):
        out = real_pair(cp, dev, tag, *a, **k)
        check(list(out), tag)
        return out
    W.fresh, W.fresh_pair = fresh, fresh_pair

    recs = R.record_packed(L, [], other="cupy")
    R._zero_pointers(fakecp, L)
    out = {{}}
    for model, amp, cl in (("resnet20", None, False), ("mobilenet", None, False), ("lenet5", None, False),
                           ("resnet20", mdn.bfloat16, True), ("mobilenet", mdn.bfloat16, False)):
        runs = []
        for on in (True, False):
            W.RECYCLE[0] = on
            W.clear()
            mdn.manual_seed(0)
            m = {{"resnet20": lambda: M.resnet20(num_classes=10),
                 "mobilenet": lambda: M.MobileNetSmall(num_classes=10, in_channels=3),
                 "lenet5": lambda: M.LeNet5(num_classes=10, in_channels=1, input_size=32)}}[model]().to("cuda")
            shape = (4, 1, 32, 32) if model == "lenet5" else (4, 3, 16, 16)
            x = mdn.randn(*shape).to("cuda")
            if cl:
                m, x = m.to(memory_format=mdn.channels_last), x.to(memory_format=mdn.channels_last)
            y = mdn.randint(0, 10, (4,)).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            for i in range(4):
                recs.clear()
                with mdn.autocast("cuda", dtype=amp or mdn.bfloat16, enabled=amp is not None):
                    loss = mdn.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            runs.append(json.dumps(recs))
        out[f"{{model}} {{amp}} cl={{cl}}"] = [runs[0] == runs[1], len(json.loads(runs[0])), W._local.kept_nbytes]
    out["handed"] = sum(handed.values())
    out["overlaps"] = dict(overlaps)
    print("RESULT" + json.dumps(out))
""")


def test_training_steps_hand_out_no_memory_a_live_array_covers():
    got = run_fake_script(_STEPS, ROOT)
    assert got.pop("overlaps") == {}
    assert got.pop("handed") > 300
    for name, (same, n, kept) in got.items():
        assert same and n > 20, name        # the same launches either way (pointers read as 0)

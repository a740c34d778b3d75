"""Conv filter re-layouts kept per weight version (backend.convolution_filter_version, conv_igemm._kept_filter), on
the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded, never run) in a subprocess.
Checked, with the cache switched on (it is off by default): an nn Conv2d's KRSC filter copy is made once while its
Parameter's version is unchanged, and again after every kind of write minidnn sees -- an in-place op under no_grad,
copy_, an nn.init function, load_state_dict, an optimizer step (fused and unfused) --, after ``p.data`` is rebound,
after a CUDA-graph replay, and for a plain Tensor weight never kept; while the stream captures nothing is hit or
kept (the eager entry survives the capture untouched); the entries go with the Parameter; with the cache off (the
default) the launches are those of the tree without it.  And a training step makes as many launches with the
cache on as off: each weight version meets each form once per step (docs/host_overhead.md round 11).  The bits on
a GPU: test_conv_filter_cache_cuda.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import gc, json, sys, types
    sys.path.insert(0, {root!r} + "/tools")
    import numpy as np
    import record_launches as R
    fakecp, L = R._install({root!r})
    def _np(name):                      # CuPy functions the fake lacks: NumPy's, on fake arrays
        f = getattr(np, name)
        return (lambda *a, **k: (lambda r: r.view(fakecp.ndarray) if isinstance(r, np.ndarray) else r)(f(*a, **k))) \
            if callable(f) else f
    fakecp.__getattr__ = _np
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    fakecp.cuda.Stream = types.SimpleNamespace
    capturing = [False]
    fakecp.cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=7)
    fakecp.cuda.runtime.streamIsCapturing = lambda p: capturing[0]
    recs = []
    L._go = lambda fn, dims, stream, params_ptr: recs.append(str(fn))
    L.count_launches = lambda n=1: recs.extend(["cupy"] * n)
    import numpy as np
    import minidnn as mdn
    from minidnn.backend.cuda import conv_igemm as K, graphs as G
    K.FILTER_CACHE[0] = {on!r}
    nn = mdn.nn
    out = {{}}
    def copies(fn):
        del recs[:]
        fn()
        return sum(r.startswith("nchw_to_nhwc") for r in recs)
    mdn.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1, bias=False).to("cuda")
    x = mdn.randn(128, 16, 32, 32).to("cuda")
    def fwd():
        with mdn.no_grad():
            conv(x)
    out["first"] = copies(fwd)            # x staged + the filter's KRSC copy
    out["again"] = copies(fwd)            # x staged only (when kept)
    with mdn.no_grad():
        conv.weight.mul_(1.0)
    out["after_mul_"] = copies(fwd)
    out["after_mul_again"] = copies(fwd)
    with mdn.no_grad():
        conv.weight.copy_(mdn.zeros(16, 16, 3, 3).to("cuda"))
    out["after_copy_"] = copies(fwd)
    nn.init.constant_(conv.weight, 0.01)
    out["after_init"] = copies(fwd)
    conv.load_state_dict(conv.state_dict())
    out["after_load"] = copies(fwd)
    conv.weight.data = conv.weight.data.copy()
    out["after_rebind"] = copies(fwd)
    G.REPLAYS[0] += 1
    out["after_replay"] = copies(fwd)
    capturing[0] = True
    out["captured"] = copies(fwd)         # no hit: the graph makes its own copy
    out["captured_again"] = copies(fwd)   # and keeps none
    capturing[0] = False
    out["after_capture"] = copies(fwd)    # the eager entry is still there
    for fused in (True, False):
        opt = mdn.optim.SGD(conv.parameters(), lr=0.1, fused=fused)
        conv(x).sum().backward()
        opt.step()
        out["after_step_%s" % fused] = copies(fwd)
        out["after_step_again_%s" % fused] = copies(fwd)
        conv.weight.grad = None
    plain = conv.weight.detach()          # a plain Tensor: never vouched for, copied at every call
    out["plain"] = [copies(lambda: mdn.nn.functional.conv2d(x, plain, padding=1)) for _ in range(2)]
    out["kept_bytes"] = K.kept_filter_bytes()
    # a training step: as many launches with the cache on as off (each version meets each form once)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    step(); step()
    del recs[:]
    step()
    out["step"] = list(recs)
    del conv, opt, model, plain
    gc.collect()
    out["kept_after_del"] = len(K._kept)
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=2)
def _run(on):
    script = _SCRIPT.format(root=str(ROOT), on=on)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_kept_while_the_version_is_unchanged():
    r = _run(True)
    assert r["first"] == 2 and r["again"] == 1
    assert r["kept_bytes"] == 16 * 16 * 9 * 4


def test_every_write_minidnn_sees_makes_a_new_copy():
    r = _run(True)
    for name in ("after_mul_", "after_copy_", "after_init", "after_load", "after_rebind", "after_replay",
                 "after_step_True", "after_step_False"):
        assert r[name] == 2, name
    for name in ("after_mul_again", "after_step_again_True", "after_step_again_False"):
        assert r[name] == 1, name


def test_capture_neither_hits_nor_keeps():
    r = _run(True)
    assert r["captured"] == 2 and r["captured_again"] == 2
    assert r["after_capture"] == 1


def test_plain_tensor_weights_are_not_kept_and_entries_go_with_the_parameter():
    r = _run(True)
    assert r["plain"] == [2, 2]
    assert r["kept_after_del"] == 0


def test_off_by_default_and_a_training_step_launches_the_same():
    on, off = _run(True), _run(False)
    assert off["again"] == 2 and off["kept_bytes"] == 0
    assert on["step"] == off["step"]
    assert sum(s.startswith("nchw_to_nhwc") for s in on["step"]) > 0

"""The convolution filters' kept KRSC copies (backend/cuda/conv_filter_keep.py), on the CPU: nn's GPU path run under
tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run) in a subprocess.  What is checked,
on three staged 3x3 convolutions run in turn like a model's forward:
- the first forward makes each filter's copy itself (one ``nchw_to_nhwc`` a filter, as without keeping); every later
  forward makes none and launches ``krsc_many`` once, at its first convolution, with every kept filter in its table;
- a copy is handed out only while its owner's version holds: a weight changed in place (no_grad) between the refresh
  and its convolution refreshes again; an owner's array replaced makes a new copy;
- a copy is never handed out twice without a refresh (a convolution used twice in one forward refreshes again);
- a dead owner's copy leaves at the next call; a copy idle for IDLE_LIMIT refreshes leaves its group;
- while the stream captures a CUDA graph nothing is kept or handed out (each call copies its filter, as before);
- switched off, the launches are those of the per-call copies.
The bits of ``krsc_many`` and of training with it on a GPU: tests/nn/test_conv_filter_keep_cuda.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, types
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    recs = R.record_packed(L, [], other="cupy")
    import minidnn as mdn
    from minidnn.backend.cuda import conv_filter_keep as K
    from minidnn.nn import functional as F
    from minidnn.tensor import Tensor
    out = {{}}

    def names():
        return [r[0].split("(")[0] for r in recs]

    rng = __import__("numpy").random.default_rng(0)
    x = Tensor._from_array(fakecp.asarray(rng.standard_normal((128, 16, 32, 32)).astype("float32")))
    x.requires_grad = True
    ws = []
    for _ in range(3):
        w = Tensor._from_array(fakecp.asarray(rng.standard_normal((16, 16, 3, 3)).astype("float32")))
        w.requires_grad = True
        ws.append(w)

    def conv(i, inp):
        return F.conv2d(inp, ws[i], None, 1, 1)

    def forward(order=(0, 1, 2), between=None):
        del recs[:]
        h = x
        for j, i in enumerate(order):
            if between is not None:
                between(j)
            h = conv(i, h)
        return names()

    for rep in range(3):
        out["fwd%d" % rep] = forward()
    out["kept"] = K.kept_count()
    out["rows"] = [len(g.entries) for g in K._local.groups.values()]

    def bump(j):                                 # conv 2's weight changed in place after the refresh at conv 0
        if j == 2:
            with mdn.no_grad():
                ws[2].mul_(1.0)
    out["bumped"] = forward(between=bump)
    out["twice"] = forward(order=(0, 1, 1, 2))
    old = ws[1]
    ws[1] = Tensor._from_array(old.data.copy())
    ws[1].requires_grad = True
    out["replaced"] = forward()
    out["kept_replaced_alive"] = K.kept_count()
    del old                                      # its copy leaves at the next call
    for rep in range(K.IDLE_LIMIT + 2):          # conv 2 idle (the first of these may refresh nothing)
        forward(order=(0, 1))
        if rep == 0:
            out["kept_after_replace"] = K.kept_count()
    out["kept_idle"] = K.kept_count()
    out["back"] = forward()

    # capturing: every call copies its own filter, nothing handed out or refreshed
    real_stream = fakecp.cuda.get_current_stream
    fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
    fakecp.cuda.runtime.streamIsCapturing = lambda s: True
    out["capturing"] = forward()
    fakecp.cuda.get_current_stream = real_stream
    fakecp.cuda.runtime.streamIsCapturing = lambda s: False
    K.KEEP[0] = False
    out["off"] = forward()
    K.KEEP[0] = True
    K.clear()
    out["cleared"] = K.kept_count()
    print("JSON" + json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=600, cwd=str(ROOT))
    line = [s for s in r.stdout.splitlines() if s.startswith("JSON")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line[0][4:])


def _count(names, kernel):
    return sum(n == kernel for n in names)


@pytest.fixture(scope="module")
def rec():
    return _run()


def test_later_forwards_refresh_every_copy_in_one_launch(rec):
    first, second, third = rec["fwd0"], rec["fwd1"], rec["fwd2"]
    assert _count(first, "krsc_many") == 0 and _count(first, "conv_igemm") == 3
    # each conv stages x and its filter the first time; later only x, plus one refresh at the first conv
    assert _count(first, "nchw_to_nhwc") == 6
    for later in (second, third):
        assert _count(later, "krsc_many") == 1 and _count(later, "nchw_to_nhwc") == 3
        assert later.index("krsc_many") < later.index("conv_igemm")     # before the first conv's kernel
    assert rec["kept"] == 3 and rec["rows"] == [3]


def test_a_changed_version_or_a_second_use_refreshes_again(rec):
    assert _count(rec["bumped"], "krsc_many") == 2 and _count(rec["bumped"], "nchw_to_nhwc") == 3
    # conv 1 twice: its second use finds its copy handed out already.  (Convs 0 and 1 take the copies of the
    # refresh that conv 2 made at the end of the previous forward: nothing changed since.)
    twice = rec["twice"]
    assert _count(twice, "krsc_many") == 1 and _count(twice, "conv_igemm") == 4
    igemm = [i for i, n in enumerate(twice) if n == "conv_igemm"]
    assert igemm[1] < twice.index("krsc_many") < igemm[2]


def test_a_replaced_array_gets_its_own_copy_and_dead_or_idle_copies_leave(rec):
    # conv 1's new weight: copied by its own call (one more nchw_to_nhwc); the old owner's copy leaves
    assert _count(rec["replaced"], "krsc_many") == 1 and _count(rec["replaced"], "nchw_to_nhwc") == 4
    assert rec["kept_replaced_alive"] == 4 and rec["kept_after_replace"] == 3
    assert rec["kept_idle"] == 2                # conv 2 left after IDLE_LIMIT refreshes without a use
    assert _count(rec["back"], "nchw_to_nhwc") == 4     # ... and comes back with its own copy


def test_capture_and_the_switch_copy_per_call(rec):
    for key in ("capturing", "off"):
        assert _count(rec[key], "krsc_many") == 0 and _count(rec[key], "nchw_to_nhwc") == 6, key
    assert rec["cleared"] == 0

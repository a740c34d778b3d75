"""The convolution filters' kept KRSC copies (backend/cuda/conv_filter_keep.py), on the CPU: nn's GPU path run under
tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run) in a subprocess.  What is checked,
on three staged 3x3 convolutions run in turn like a model's forward:
- a filter is kept from its second call; from then on every forward makes no filter copy and launches
  ``krsc_many`` once, at its first convolution, with every kept filter in its table;
- a copy is handed out only while its owner's version holds: a weight changed in place (no_grad) between the refresh
  and its convolution refreshes again; an owner's array replaced is a new owner (kept from its second call);
- a convolution re-used back to back copies its own filter (no refresh); one re-used after others refreshes; in both
  cases the next forward's first convolution refreshes again (no token survives the pass -- the review's stale case);
- a dead owner's copy leaves at the next call; a copy idle for IDLE_LIMIT refreshes leaves its group;
- while the stream captures a CUDA graph nothing is kept or handed out (each call copies its filter, as before);
- switched off, the launches are those of the per-call copies; ``clear`` frees the copies at once (no cycle);
- under autocast (bfloat16, the fused SGD's kept low-precision copy), the refill's version bump makes a layer that
  holds a token from the previous pass refresh before its convolution.
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
    R.numpy_fallback(fakecp)            # (as tools/fake_gpu_step.py: what the fake lacks falls back to NumPy, and
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None  # no copy runs)
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

    for rep in range(4):
        out["fwd%d" % rep] = forward()
    out["kept"] = K.kept_count()
    out["rows"] = [len(g.entries) for g in K._local.groups.values()]

    def bump(j):                                 # conv 2's weight changed in place after the refresh at conv 0
        if j == 2:
            with mdn.no_grad():
                ws[2].mul_(1.0)
    out["bumped"] = forward(between=bump)
    out["twice"] = forward(order=(0, 1, 1, 2))
    out["after_twice"] = forward()
    out["interleaved"] = forward(order=(0, 1, 2, 1))
    out["after_interleaved"] = forward()
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
    import gc, weakref
    kept = [weakref.ref(e.dst) for g in K._local.groups.values() for e in g.entries.values()]
    K.clear()
    out["cleared"] = [K.kept_count(), sum(r() is not None for r in kept), len(kept)]

    # autocast: two layers, the fused SGD's kept bfloat16 copy (refilled, versions bumped, each region)
    nn = mdn.nn
    mdn.manual_seed(0)
    net = [nn.Conv2d(16, 16, 3, padding=1, bias=False).to("cuda") for _ in range(2)]
    opt = mdn.optim.SGD([m.weight for m in net], lr=0.1, momentum=0.9)
    xa = mdn.randn(128, 16, 32, 32).to("cuda")

    def amp_pass(order):
        del recs[:]
        with mdn.autocast("cuda", dtype=mdn.bfloat16):
            h = xa
            for i in order:
                h = net[i](h)
            loss = h.float().square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return names()
    for rep in range(4):
        amp_pass((0, 1))
    amp_pass((0,))                    # layer 1 keeps the token this pass's refresh gave it
    out["amp_bumped"] = amp_pass((1, 0))
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
    for first in (rec["fwd0"], rec["fwd1"]):     # met, then kept: each conv stages x and its filter
        assert _count(first, "krsc_many") == 0 and _count(first, "conv_igemm") == 3
        assert _count(first, "nchw_to_nhwc") == 6
    for later in (rec["fwd2"], rec["fwd3"]):    # only x, plus one refresh at the first conv
        assert _count(later, "krsc_many") == 1 and _count(later, "nchw_to_nhwc") == 3
        assert later.index("krsc_many") < later.index("conv_igemm")     # before the first conv's kernel
    assert rec["kept"] == 3 and rec["rows"] == [3]


def test_a_changed_version_refreshes_again(rec):
    assert _count(rec["bumped"], "krsc_many") == 2 and _count(rec["bumped"], "nchw_to_nhwc") == 3


def test_a_re_used_convolution_leaves_no_token_for_the_next_pass(rec):
    # conv 1 back to back: its own copy (one more nchw_to_nhwc), no refresh
    twice = rec["twice"]
    assert _count(twice, "krsc_many") == 1 and _count(twice, "conv_igemm") == 4
    assert _count(twice, "nchw_to_nhwc") == 5
    # conv 1 after conv 2: a refresh, whose tokens go to conv 2 alone
    inter = rec["interleaved"]
    assert _count(inter, "krsc_many") == 2 and _count(inter, "nchw_to_nhwc") == 4
    for after in (rec["after_twice"], rec["after_interleaved"]):   # conv 0 holds no token: it refreshes
        assert after.index("krsc_many") < after.index("conv_igemm") and _count(after, "krsc_many") == 1


def test_a_replaced_array_is_a_new_owner_and_dead_or_idle_copies_leave(rec):
    # conv 1's new weight: met (its own copy), the old owner's copy still there until it dies
    assert _count(rec["replaced"], "krsc_many") == 1 and _count(rec["replaced"], "nchw_to_nhwc") == 4
    assert rec["kept_replaced_alive"] == 3 and rec["kept_after_replace"] == 3
    assert rec["kept_idle"] == 2                # conv 2 left after IDLE_LIMIT refreshes without a use
    assert _count(rec["back"], "nchw_to_nhwc") == 4     # ... and comes back (met again: its own copy)


def test_capture_and_the_switch_copy_per_call(rec):
    for key in ("capturing", "off"):
        assert _count(rec[key], "krsc_many") == 0 and _count(rec[key], "nchw_to_nhwc") == 6, key
    count, alive, made = rec["cleared"]
    assert count == 0 and made >= 2 and alive == 0      # freed by clear() itself, no collector needed


def test_autocast_refill_bumps_the_kept_weights_versions(rec):
    seq = rec["amp_bumped"]
    assert seq.index("krsc_many") < seq.index("conv_igemm")     # layer 1's token: its version moved

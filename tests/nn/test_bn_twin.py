"""Batch norm's speculative twin (nn/_functions/norm.py ``TWIN``, docs/fusion.md "Batch norm's forward writes relu(y)
too") on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers, never
run) in a subprocess.  Each scenario runs four steps with the switch on and off; the last step's forward launches, the
node relu records, the backward's launches and the gradients' layouts are compared.  Where the twin is taken, the on
run's forward is the off run's batch-norm launch with the TWIN option and one more (null) array pointer, and no ReLU
launch; relu's output is the very array the kernel wrote as the twin.  Where it must not be taken (an in-place change
of y, y's array replaced, a hook or retain_grad on y, a second ReLU of y, fusion off, no_grad, eval) the plain ReLU
runs as with the switch off.  A layer whose twins go unused stops after TWIN_MISSES launches.  Whole model steps
(tools/fake_gpu_step.py MODE=record): ResNet-20 and MobileNet-small launch one kernel fewer per BN -> ReLU pair and
are otherwise the same launches.  The bits on a GPU: test_twins_cuda.py; the kernels' text: tests/backend/
test_bn_twin.py."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE, NODE_VIEW, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + NODE_VIEW + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    import minidnn.backend as B
    from minidnn.backend.cuda import device_facts as DF
    from minidnn.nn import functional as F
    from minidnn.nn._functions import norm as N
    AG._check_anomaly = lambda *a, **k: None

    twins = []                  # every twin array the kernels' twin call returned
    real_twin = N._Remembered._twin
    def spy(self, *a):
        out = real_twin(self, *a)
        if out is not None:
            twins.append(out[3])
        return out
    N._Remembered._twin = spy

    def layout(t):
        return None if t is None else [list(t.data.shape), list(t.data.strides), str(t.data.dtype)]

    SHAPES = dict(nchw=(4, 16, 6, 6), cl=(4, 16, 6, 6), bf16=(4, 16, 6, 6), cl_bf16=(4, 16, 6, 6), rows=(8, 16),
                  fwdc=(16, 64, 16, 16))

    def scenario(name, on, steps=4):
        N.TWIN[0] = on
        N._REMEMBERED.clear()
        DF._smem.clear()
        if name == "fwdc":               # an H100's shared memory: the NCHW call takes bn_cluster's bn_fwdc
            DF._smem[0] = (233472, 232448)
        shape = SHAPES.get(name, SHAPES["nchw"])
        mdn.manual_seed(0)
        bn = (mdn.nn.BatchNorm1d if len(shape) == 2 else mdn.nn.BatchNorm2d)(shape[1]).to("cuda")
        x = mdn.randn(*shape).to("cuda")
        if "bf16" in name:
            x = x.to(mdn.bfloat16)      # (float32 parameters, as under autocast)
        if name.startswith("cl"):
            bn.to(memory_format=mdn.channels_last)
            x = x.to(memory_format=mdn.channels_last)
        x.requires_grad_()
        out = {{}}
        del twins[:]
        for i in range(steps):
            last = i == steps - 1
            if name == "eval" and last:
                bn.eval()
            if last:
                del recs[:]
            if name == "fusion_off" and last:
                B.cudnn.fusion = False
            with mdn.set_grad_enabled(not (name == "no_grad" and last)):
                y = bn(x)
                yn = y.grad_fn
                if last:
                    if name == "inplace_no_grad":
                        with mdn.no_grad():
                            y.add_(1.0)
                    elif name == "inplace":
                        y.add_(1.0)
                    elif name == "replaced":
                        y.data = y.data.copy()
                    elif name == "hook":
                        y.register_hook(lambda g: g)
                    elif name == "retain":
                        y.retain_grad()
                    elif name == "other_first":
                        (y * 2.0).sum()
                r = F.relu(y)
                r2 = F.relu(y) if last and name == "two_relus" else None
                B.cudnn.fusion = True
            if last:
                out["fwd"] = [list(rec) for rec in recs]
                out["node"] = node(r)
                out["is_twin"] = bool(twins) and r.data is twins[-1]
                out["twins"] = len(twins)
                out["bn_fields"] = None if yn is None else sorted(k for k in yn.__dict__ if k not in ("seen", "sh"))
                if r2 is not None:
                    out["r2"] = [node(r2), r2.data is r.data, any(r2.data is t for t in twins)]
                del recs[:]
            if r.requires_grad:
                (r if r2 is None else r + r2).backward(mdn.ones(*r.shape).to("cuda").to(r.dtype))
            if last:
                out["bwd"] = [list(rec) for rec in recs]
                out["grads"] = [layout(x.grad), layout(bn.weight.grad), layout(bn.bias.grad)]
                out["misses"] = [e.misses for e in N._REMEMBERED.values()]
            x.grad = None
            bn.zero_grad()
        return out

    def unused(on, steps=8):
        # two steps with a ReLU (the entry learns it), then batch norm alone: the twin is launched TWIN_MISSES times
        N.TWIN[0] = on
        N._REMEMBERED.clear()
        DF._smem.clear()
        mdn.manual_seed(0)
        bn = mdn.nn.BatchNorm2d(16).to("cuda")
        x = mdn.randn(4, 16, 6, 6).to("cuda").requires_grad_()
        del twins[:]
        per_step = []
        for i in range(steps):
            y = bn(x)
            if i < 2:
                y = F.relu(y)
            per_step.append(len(twins))
            y.sum().backward()
            x.grad = None
            bn.zero_grad()
        return per_step

    names = ["nchw", "cl", "bf16", "cl_bf16", "rows", "fwdc", "inplace_no_grad", "inplace", "replaced", "hook",
             "retain", "other_first", "two_relus", "fusion_off", "no_grad", "eval"]
    res = {{n: [scenario(n, True), scenario(n, False)] for n in names}}
    res["unused"] = [unused(True), unused(False)]
    res["misses_limit"] = N.TWIN_MISSES
    print("RESULT" + json.dumps(res))
""")


@pytest.fixture(scope="module")
def out():
    return run_fake_script(_SCRIPT, ROOT)


_TAKEN = ["nchw", "cl", "bf16", "cl_bf16", "rows", "fwdc", "other_first", "two_relus"]
_DECLINED = ["inplace_no_grad", "inplace", "replaced", "hook", "retain", "fusion_off", "no_grad", "eval"]


def _name(rec):
    return rec[0].split("(")[0]


def _twin_of(on_rec, off_rec):
    """on_rec is off_rec's batch-norm launch with the TWIN option and one more (null) array pointer (12 -> 13)."""
    def opts(rec):      # (kernel, its build options in any order: a SPLIT build (session 17) puts TWIN after SPLIT)
        name, _, rest = rec.partition("(")
        return name, sorted(rest.rstrip(")").split(", "))
    (n1, o1), (n0, o0) = opts(on_rec[0]), opts(off_rec[0])
    assert n1 == n0 and o1 == sorted(o0 + ["'-DTWIN=1'"]), (on_rec[0], off_rec[0])
    assert on_rec[1] == off_rec[1]                                  # grid, block, shared memory
    head = 2 * 8 * 12
    assert on_rec[2][:head + 16] == "0" * (head + 16) and on_rec[2][head + 16:] == off_rec[2][head:]


@pytest.mark.parametrize("name", _TAKEN)
def test_the_twin_replaces_the_relu_launch(out, name):
    on, off = out[name]
    relus = 2 if name == "two_relus" else 1         # (the second ReLU of y launches as before)
    assert on["is_twin"] and not off["is_twin"] and off["twins"] == 0
    assert [_name(r) for r in off["fwd"]] == [_name(off["fwd"][0])] + ["act_fwd"] * relus
    assert _name(off["fwd"][0]) in ("bn_fwd1", "bnc_fwd1", "bn_fwdc")
    assert len(on["fwd"]) == relus and on["fwd"][1:] == off["fwd"][2:]
    _twin_of(on["fwd"][0], off["fwd"][0])
    if name == "fwdc":
        assert _name(on["fwd"][0]) == "bn_fwdc"
    if name.startswith("cl") or name == "rows":
        assert _name(on["fwd"][0]) == "bnc_fwd1"
    # the same node, backward and gradients as the plain ReLU's path
    assert on["node"] == off["node"] and on["node"]["cls"] == "BatchNormReLU"
    assert on["bwd"] == off["bwd"] and on["grads"] == off["grads"]
    assert on["bn_fields"] == off["bn_fields"] and "twin" not in on["bn_fields"]     # taken off batch norm's node
    assert on["misses"] == [0]                      # taken: the entry's run of unused twins starts again
    assert on["twins"] == 2                         # steps 3 and 4 (the ReLU is learnt on step 2)


def test_a_second_relu_of_y_gets_its_own_array(out):
    on, off = out["two_relus"]
    node2, same_as_r, is_a_twin = on["r2"]
    assert not same_as_r and not is_a_twin and node2 == off["r2"][0]


@pytest.mark.parametrize("name", _DECLINED)
def test_the_plain_relu_runs_where_the_twin_may_not_be_used(out, name):
    on, off = out[name]
    assert not on["is_twin"]
    assert on["node"] == off["node"] and on["bwd"] == off["bwd"] and on["grads"] == off["grads"]
    if name in ("inplace_no_grad", "replaced", "hook", "retain", "inplace"):
        # the twin was written (speculated) and left unused: the ReLU launched as with the switch off
        assert [_name(r) for r in on["fwd"]] == [_name(r) for r in off["fwd"]]
        assert on["twins"] == 2 and "act_fwd" in [_name(r) for r in on["fwd"]]
        _twin_of(on["fwd"][0], off["fwd"][0])
        assert on["fwd"][1:] == off["fwd"][1:]
        if name in ("hook", "retain", "inplace"):   # the rule declined: the twin stays on the node, unused
            assert on["bn_fields"] == sorted(off["bn_fields"] + ["twin"])
        else:                               # relu_node took it off and dropped it (y no longer what it was)
            assert on["bn_fields"] == off["bn_fields"]
    else:   # fusion off, no_grad, eval: no twin written at all -- the switch-off launches
        assert on["fwd"] == off["fwd"] and on["twins"] == 1
    if name == "inplace_no_grad":
        assert on["node"]["cls"] == "BatchNormReLU"  # (the fusion still applies: only the twin is stale)
    if name in ("hook", "retain", "fusion_off", "inplace"):
        assert on["node"]["cls"] != "BatchNormReLU"


def test_a_layer_whose_twins_go_unused_stops_speculating(out):
    on, off = out["unused"]
    limit = out["misses_limit"]
    assert off == [0] * len(off)
    # step 3 (index 2) is the first twin; then one a step until `limit` went unused in a row
    assert on == [0, 0] + [min(i, limit) for i in range(1, len(on) - 1)]


# ---- whole model steps -------------------------------------------------------------------------------------------

def _record(model, amp, cl, twin, tmp_path):
    path = tmp_path / f"{model}_{amp}_{cl}_{twin}.json"
    env = dict(os.environ, MODE="record", OUT=str(path), AMP=amp, CL=cl, MINIDNN_BN_TWIN=twin,
               MINIDNN_ADD_TWIN="0",      # (the residual add's twin, its own -DTWIN=1 launches: test_add_twin.py)
               MINIDNN_TWIN_NHWC="0")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "fake_gpu_step.py"), str(ROOT), model, "128"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(path.read_text())


@pytest.mark.parametrize("model, pairs", [("resnet20", 10), ("mobilenet", 9)])
@pytest.mark.parametrize("amp, cl", [("", "0"), ("bf16", "1")], ids=["fp32", "bf16_cl"])
def test_a_model_step_launches_one_kernel_fewer_per_bn_relu_pair(model, pairs, amp, cl, tmp_path):
    """ResNet-20: the stem's and each block's first batch norm feed a ReLU (10; the second's ReLU follows the residual
    add); MobileNet-small: 9.  The rest of the step is the same launches."""
    off = _record(model, amp, cl, "0", tmp_path)
    on = _record(model, amp, cl, "1", tmp_path)
    assert len(off) - len(on) == pairs
    kept, dropped = [], 0
    for i, rec in enumerate(off):
        if _name(rec) == "act_fwd" and "M_RELU" in rec[0] and i and _name(off[i - 1]) in ("bn_fwd1", "bnc_fwd1",
                                                                                          "bn_fwdc") \
                and dropped < pairs and "-DTWIN=1" in on[len(kept) - 1][0]:
            dropped += 1
            continue
        kept.append(rec)
    assert dropped == pairs and len(kept) == len(on)
    twins = 0
    for a, b in zip(on, kept):
        if "-DTWIN=1" in a[0]:
            twins += 1
            _twin_of(a, b)
        else:
            assert a == b
    assert twins == pairs

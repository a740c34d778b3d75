"""The residual add's speculative twin (nn/_functions/norm.py ``ADD_TWIN``, docs/fusion.md "The residual add writes
relu(a) too") on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null
pointers, never run) in a subprocess.  Each scenario -- relu(batch_norm(x) + z), the shape of a residual block's end
-- runs four steps with the switch on and off; the last step's forward launches, the node relu records, the
backward's launches and the gradients' layouts are compared.  Where the twin is taken, the on run's forward is the off
run's with the add's launch carrying the TWIN option and one more (null) array pointer, and no ReLU launch; relu's
output is the very array the add wrote as the twin.  Where it must not be taken (an in-place change of the sum, its
array replaced, a hook or retain_grad on it, a hook on batch norm's output, fusion off, no_grad, eval, a shortcut in
another memory order) the plain ReLU runs as with the switch off.  A layer whose twins go unused stops after
TWIN_MISSES launches.  Whole model steps (tools/fake_gpu_step.py MODE=record): ResNet-20 launches one kernel fewer per
residual block (9), fp32 and bf16, NCHW and channels-last, and is otherwise the same launches.  The bits on a GPU:
test_twins_cuda.py; the kernel: tests/backend/test_add_twin.py."""
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
    from minidnn.nn import functional as F
    from minidnn.nn._functions import norm as N
    AG._check_anomaly = lambda *a, **k: None

    twins = []                  # every twin array the add's twin launch returned
    real_twin = N._Remembered.add_twin
    def spy(self, *a):
        out = real_twin(self, *a)
        if out is not None:
            twins.append(out[0])
        return out
    N._Remembered.add_twin = spy

    def layout(t):
        return None if t is None else [list(t.data.shape), list(t.data.strides), str(t.data.dtype)]

    def scenario(name, on, steps=4):
        N.ADD_TWIN[0] = on
        N._REMEMBERED.clear()
        shape = (4, 16, 6, 6)
        mdn.manual_seed(0)
        bn = mdn.nn.BatchNorm2d(16).to("cuda")
        bs = mdn.nn.BatchNorm2d(16).to("cuda")          # the shortcut's batch norm (option B)
        x = mdn.randn(*shape).to("cuda")
        z = mdn.randn(*shape).to("cuda")
        if "bf16" in name:
            x, z = x.to(mdn.bfloat16), z.to(mdn.bfloat16)    # (float32 parameters, as under autocast)
        if name.startswith("cl"):
            for m in (bn, bs):
                m.to(memory_format=mdn.channels_last)
            x, z = (t.to(memory_format=mdn.channels_last) for t in (x, z))
        if name == "z_layout":
            z = z.to(memory_format=mdn.channels_last)
        x.requires_grad_()
        if name != "z_no_grad":
            z.requires_grad_()
        out = {{}}
        del twins[:]
        for i in range(steps):
            last = i == steps - 1
            if name == "eval" and last:
                bn.eval()
                bs.eval()
            if last:
                del recs[:]
            if name == "fusion_off" and last:
                B.cudnn.fusion = False
            with mdn.set_grad_enabled(not (name == "no_grad" and last)):
                y = bn(x)
                if last and name == "hook_y":
                    y.register_hook(lambda g: g)
                s = bs(z) if name == "shortcut_bn" else z
                a = s + y if name == "z_first" else y + s
                add = a.grad_fn
                if last:
                    if name == "inplace_no_grad":
                        with mdn.no_grad():
                            a.add_(1.0)
                    elif name == "inplace":
                        a.add_(1.0)
                    elif name == "replaced":
                        a.data = a.data.copy()
                    elif name == "hook_a":
                        a.register_hook(lambda g: g)
                    elif name == "retain":
                        a.retain_grad()
                    elif name == "other_first":
                        (a * 2.0).sum()
                r = F.relu(a)
                r2 = F.relu(a) if last and name == "two_relus" else None
                B.cudnn.fusion = True
            if last:
                out["fwd"] = [list(rec) for rec in recs]
                out["node"] = node(r)
                out["is_twin"] = bool(twins) and r.data is twins[-1]
                out["twins"] = len(twins)
                out["left_on_add"] = add is not None and getattr(add, "twin", None) is not None
                if r2 is not None:
                    out["r2"] = [node(r2), r2.data is r.data, any(r2.data is t for t in twins)]
                del recs[:]
            if r.requires_grad:
                (r if r2 is None else r + r2).backward(mdn.ones(*r.shape).to("cuda").to(r.dtype))
            if last:
                out["bwd"] = [list(rec) for rec in recs]
                out["grads"] = [layout(x.grad), layout(z.grad), layout(bn.weight.grad), layout(bn.bias.grad)]
                out["misses"] = sorted(e.add_misses for e in N._REMEMBERED.values())
            x.grad = z.grad = None
            bn.zero_grad()
            bs.zero_grad()
        return out

    def unused(on, steps=8):
        # two steps with a ReLU of the sum (the entry learns it), then the sum alone: TWIN_MISSES twins launched
        N.ADD_TWIN[0] = on
        N._REMEMBERED.clear()
        mdn.manual_seed(0)
        bn = mdn.nn.BatchNorm2d(16).to("cuda")
        x = mdn.randn(4, 16, 6, 6).to("cuda").requires_grad_()
        z = mdn.randn(4, 16, 6, 6).to("cuda").requires_grad_()
        del twins[:]
        per_step = []
        for i in range(steps):
            a = bn(x) + z
            if i < 2:
                a = F.relu(a)
            per_step.append(len(twins))
            a.sum().backward()
            x.grad = z.grad = None
            bn.zero_grad()
        return per_step

    names = ["nchw", "cl", "bf16", "cl_bf16", "shortcut_bn", "z_first", "z_no_grad", "other_first", "two_relus",
             "inplace_no_grad", "inplace", "replaced", "hook_a", "retain", "hook_y", "z_layout", "fusion_off",
             "no_grad", "eval"]
    res = {{n: [scenario(n, True), scenario(n, False)] for n in names}}
    res["unused"] = [unused(True), unused(False)]
    res["misses_limit"] = N.TWIN_MISSES
    print("RESULT" + json.dumps(res))
""")


@pytest.fixture(scope="module")
def out():
    return run_fake_script(_SCRIPT, ROOT)


_TAKEN = ["nchw", "cl", "bf16", "cl_bf16", "shortcut_bn", "z_first", "z_no_grad", "other_first", "two_relus"]
_WRITTEN_UNUSED = ["inplace_no_grad", "inplace", "replaced", "hook_a", "retain"]
_NOT_WRITTEN = ["hook_y", "z_layout", "fusion_off", "no_grad", "eval"]


def _name(rec):
    return rec[0].split("(")[0]


def _is_add(rec):
    return _name(rec) == "act_bwd" and "M_ADD" in rec[0]


def _twin_of(on_rec, off_rec):
    """on_rec is off_rec's add launch with the TWIN option and one more (null) array pointer (3 -> 4)."""
    assert _is_add(off_rec) and "-DTWIN=1" not in off_rec[0]
    assert on_rec[0] == off_rec[0][:-1] + ", '-DTWIN=1')", (on_rec[0], off_rec[0])
    assert on_rec[1] == off_rec[1]                                  # grid, block, shared memory
    assert on_rec[2][:64] == "0" * 64 and on_rec[2][64:] == off_rec[2][48:]


@pytest.mark.parametrize("name", _TAKEN)
def test_the_add_twin_replaces_the_relu_launch(out, name):
    on, off = out[name]
    relus = 2 if name == "two_relus" else 1         # (the second ReLU of the sum launches as before)
    assert on["is_twin"] and not off["is_twin"] and off["twins"] == 0
    bns = 2 if name == "shortcut_bn" else 1
    names = [_name(r) for r in off["fwd"]]
    assert names[bns:] == ["act_bwd"] + ["act_fwd"] * relus and _is_add(off["fwd"][bns])
    assert on["fwd"][:bns] == off["fwd"][:bns]                          # the batch norms: unchanged
    _twin_of(on["fwd"][bns], off["fwd"][bns])
    assert len(on["fwd"]) == bns + relus and on["fwd"][bns + 1:] == off["fwd"][bns + 2:]
    # the same node, backward and gradients as the plain ReLU's path
    assert on["node"] == off["node"] and on["node"]["cls"] == "BatchNormAddReLU"
    assert on["bwd"] == off["bwd"] and on["grads"] == off["grads"]
    assert not on["left_on_add"]                    # taken off the add's node
    assert on["misses"] == [0] * bns                # taken: the entry's run of unused twins starts again
    assert on["twins"] == 2                         # steps 3 and 4 (the fused ReLU is learnt on step 2)


def test_a_second_relu_of_the_sum_gets_its_own_array(out):
    on, off = out["two_relus"]
    node2, same_as_r, is_a_twin = on["r2"]
    assert not same_as_r and not is_a_twin and node2 == off["r2"][0]


@pytest.mark.parametrize("name", _WRITTEN_UNUSED + _NOT_WRITTEN)
def test_the_plain_relu_runs_where_the_twin_may_not_be_used(out, name):
    on, off = out[name]
    assert not on["is_twin"]
    assert on["node"] == off["node"] and on["bwd"] == off["bwd"] and on["grads"] == off["grads"]
    if name in _WRITTEN_UNUSED:
        # the twin was written (speculated) and left unused: the ReLU launched as with the switch off
        assert on["twins"] == 2 and [_name(r) for r in on["fwd"]] == [_name(r) for r in off["fwd"]]
        k = next(i for i, r in enumerate(off["fwd"]) if _is_add(r))
        _twin_of(on["fwd"][k], off["fwd"][k])
        assert on["fwd"][:k] == off["fwd"][:k] and on["fwd"][k + 1:] == off["fwd"][k + 1:]
        assert "act_fwd" in [_name(r) for r in on["fwd"]]
        # the rule declined (a hook on the sum; an in-place change made relu's producer another node): the twin
        # stays on the add's node, unused; else add_relu_node took it off and dropped it (the sum is not what it was)
        assert on["left_on_add"] == (name in ("hook_a", "retain", "inplace"))
    else:   # no twin written at all -- the switch-off launches
        assert on["fwd"] == off["fwd"] and on["twins"] == (0 if name == "z_layout" else 1)     # (step 3's)
    if name in ("inplace_no_grad", "replaced", "z_layout"):
        assert on["node"]["cls"] == "BatchNormAddReLU"     # (the fusion still applies: only no twin to hand out)
    if name in ("hook_a", "retain", "hook_y", "fusion_off", "inplace"):
        assert on["node"]["cls"] != "BatchNormAddReLU"


def test_a_layer_whose_twins_go_unused_stops_speculating(out):
    on, off = out["unused"]
    limit = out["misses_limit"]
    assert off == [0] * len(off)
    # step 3 (index 2) is the first twin; then one a step until `limit` went unused in a row
    assert on == [0, 0] + [min(i, limit) for i in range(1, len(on) - 1)]


# ---- whole model steps -------------------------------------------------------------------------------------------

def _record(amp, cl, twin, tmp_path):
    path = tmp_path / f"resnet20_{amp}_{cl}_{twin}.json"
    env = dict(os.environ, MODE="record", OUT=str(path), AMP=amp, CL=cl, MINIDNN_ADD_TWIN=twin,
               MINIDNN_TWIN_NHWC="0")      # (the shadows' own launches: test_twin_nhwc.py)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "fake_gpu_step.py"), str(ROOT), "resnet20", "128"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(path.read_text())


@pytest.mark.parametrize("amp, cl", [("", "0"), ("bf16", "0"), ("", "1"), ("bf16", "1")],
                         ids=["fp32", "bf16", "fp32_cl", "bf16_cl"])
def test_a_resnet20_step_launches_one_kernel_fewer_per_residual_block(amp, cl, tmp_path):
    """The 9 blocks' relu(bn2(conv2(h)) + shortcut): the add writes relu(a) too and the ReLU launch goes; the rest
    of the step is the same launches (channels-last: the add takes the same ADD kernel on NHWC memory)."""
    off = _record(amp, cl, "0", tmp_path)
    on = _record(amp, cl, "1", tmp_path)
    blocks = 9
    assert len(off) - len(on) == blocks
    kept, dropped = [], 0
    for i, rec in enumerate(off):
        if _name(rec) == "act_fwd" and "M_RELU" in rec[0] and i and _is_add(off[i - 1]) \
                and "-DTWIN=1" in on[len(kept) - 1][0] and _is_add(on[len(kept) - 1]):
            dropped += 1
            continue
        kept.append(rec)
    assert dropped == blocks and len(kept) == len(on)
    twins = 0
    for a, b in zip(on, kept):
        if _is_add(a) and "-DTWIN=1" in a[0]:
            twins += 1
            _twin_of(a, b)
        else:
            assert a == b
    assert twins == blocks

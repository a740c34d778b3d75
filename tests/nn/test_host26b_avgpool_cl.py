"""Host round 26b (docs/host_overhead.md): average pooling's first-order backward of a channels-last x on a seen
signature (``nn._functions.pooling.AVGPOOL_CL_BWD``, beside round 25b's ``AVGPOOL_FAST``), on the CPU under the fake
CuPy in a subprocess.  Round 25b's pooling scenarios (tests/nn/test_host25b_seen.py's script) run with both switches
on and both off, plus channels-last variants -- float32 and bfloat16, adaptive 1x1 and 2x2, avg_pool2d, the
primitive's table cleared before the third call, create_graph: the third call's launches, node, output, backward
launches and gradient layout must be the same; on, the channels-last backward no longer reaches
AvgPoolBackward.forward (except where it must: a cleared table, create_graph); with AVGPOOL_FAST on and only
AVGPOOL_CL_BWD off it does, as before."""
import pathlib

import pytest

from tests.nn import test_host25b_seen as H
from tests.nn._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

CL_NAMES = ("cl", "cl_bf16", "cl_avg2d", "cl_out2", "cl_cleared", "cl_create_graph", "cl_mixed")


def _script(cl_switch):
    s = H._POOL
    edits = [
        ('        if name == "cl":\n', '        if name.startswith("cl") and (name != "cl_mixed" or i == 2):\n'),
        ('        if name == "bf16":\n', '        if name in ("bf16", "cl_bf16"):\n'),
        ('        if name == "cleared" and i == 2:\n', '        if name in ("cleared", "cl_cleared") and i == 2:\n'),
        ('        if name == "avg2d":\n', '        if name in ("avg2d", "cl_avg2d"):\n'),
        ('        elif name == "out2":\n', '        elif name in ("out2", "cl_out2"):\n'),
        ('            if name == "create_graph":\n', '            if name in ("create_graph", "cl_create_graph"):\n'),
        ('    PL.AVGPOOL_FAST[0] = on\n    for t in (PL._AVGPOOL_SEEN',
         '    PL.AVGPOOL_FAST[0] = on\n    PL.AVGPOOL_CL_BWD[0] = on if CL_SWITCH is None else CL_SWITCH\n'
         '    for t in (PL._AVGPOOL_SEEN'),
        ('         "anomaly", "cleared", "create_graph")',
         '         "anomaly", "cleared", "create_graph") + ' + repr(CL_NAMES)),
    ]
    for old, new in edits:
        assert s.count(old) >= 1, old           # round 25b's script as this test knows it
        s = s.replace(old, new)
    return s.replace("def scenario(name, on):", f"CL_SWITCH = {cl_switch!r}\ndef scenario(name, on):", 1)


@pytest.fixture(scope="module")
def both():
    return run_fake_script(_script(None), ROOT)["res"]


@pytest.fixture(scope="module")
def cl_off():
    return run_fake_script(_script(False), ROOT)["res"]


def test_on_and_off_give_the_same_launches_nodes_and_gradients(both):
    for name, (on, off) in both.items():
        assert {k: v for k, v in on.items() if k != "calls"} == {k: v for k, v in off.items() if k != "calls"}, name


@pytest.mark.parametrize("name", ["cl", "cl_bf16", "cl_avg2d", "cl_out2"])
def test_channels_last_backward_is_served_seen(both, cl_off, name):
    on, off = both[name]
    assert on["calls"] == {}, name                                 # neither apply nor the backward's full forward
    assert off["calls"] == {"apply": 1, "bwd_full": 1}, name
    assert on["bwd_launches"] and on["node"]["channels_last"] == "True"
    assert on["grad"][2] == cl_off[name][0]["grad"][2]              # dx channels-last, as the full path's
    assert cl_off[name][0]["calls"] == {"bwd_full": 1}, name        # only AVGPOOL_CL_BWD off: round 25b's rule
    assert {k: v for k, v in cl_off[name][0].items() if k != "calls"} == \
        {k: v for k, v in on.items() if k != "calls"}, name


def test_nchw_signature_then_channels_last(both):
    # the same dy and x shapes seen NCHW twice, then a channels-last x: its own signature (learnt by the full path)
    on, off = both["cl_mixed"]
    assert on["calls"] == {"apply": 1, "bwd_full": 1} and on["node"]["channels_last"] == "True"


def test_where_the_full_path_must_run(both):
    assert both["cl_cleared"][0]["calls"] == {"apply": 1, "bwd_full": 1}    # a cleared table: learnt again
    assert both["cl_create_graph"][0]["calls"] == {"bwd_full": 1}             # create_graph: recorded by apply
    assert both["cl_create_graph"][0]["grad"] == both["cl_create_graph"][1]["grad"]

"""The seen-call shortcuts of layer norm, group norm (backend/normalization.py _NORM_SEEN), cross-entropy
(backend/softmax.py _CE_SEEN) and softmax (softmax.py _SEEN) on the GPU path, under tools/record_launches.py's fake
CuPy in a subprocess (docs/host_overhead.md round 18):
- a repeated signature skips the checks (``begin`` is not reached) and launches what the validated call launched,
  byte for byte (kernel, options, grid, packed arguments), with results of the same shapes, dtypes and strides;
- the whole record_launches scenario gives the same launches with the shortcuts on and off;
- each changed part of the signature (shape, dtype, strides, a parameter given or not, eps, normalized_ndim,
  num_groups, blending, handle, ignore_index, label_smoothing, reduction, weight, the stats' dtype, axis) misses;
- bad input after cached calls raises the error the full path raises, and a failed call remembers nothing;
- the kernel's own per-call choice (16-byte alignment) is still made on a hit."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PRELUDE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    R.numpy_fallback(fakecp)
    recs = R.record_packed(L, [], other="cupy")
    import numpy as np
    import ml_dtypes
    import minidnn.backend as B
    from minidnn.backend import normalization as NM, softmax as SM
    full = [0]
    for mod in (NM, SM):
        real = mod.begin
        def begin(*a, _real=real, **k):
            full[0] += 1
            return _real(*a, **k)
        mod.begin = begin
    BF = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)
    def arr(*s, dt=np.float32):
        return fakecp.asarray(rng.standard_normal(s).astype(np.float32).astype(dt))
    def desc(r):
        if isinstance(r, (tuple, list)):
            return [desc(a) for a in r]
        return None if r is None else [list(r.shape), str(r.dtype), list(r.strides), type(r).__name__]
    def run(f):
        # (checks reached, launches, results' shapes/dtypes/strides) of one call
        recs.clear(); full[0] = 0
        r = f()
        return [full[0], [list(x) for x in recs], desc(r)]
    def error(f):
        n = len(NM._NORM_SEEN) + len(SM._CE_SEEN) + len(SM._SEEN)
        try:
            f()
        except Exception as e:
            return [type(e).__name__, str(e)[:60], len(NM._NORM_SEEN) + len(SM._CE_SEEN) + len(SM._SEEN) - n]
        return ["no error", "", 0]
    out = {{}}
""")


def _run(body, env=None):
    script = _PRELUDE.format(root=str(ROOT)) + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, **(env or {})))
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


# Each call: a name and the code of a zero-argument callable (over the arrays the body below makes).
_CALLS = {
    "ln_fwd": "lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5)",
    "ln_fwd_2d_noaffine": "lambda: B.layer_normalization_forward(None, x4, None, None, 2, 1e-5)",
    "ln_bwd": "lambda: B.layer_normalization_backward(None, xl, dyl, sl, ml, rl, 1)",
    "ln_bwd_2d": "lambda: B.layer_normalization_backward(None, x4, x4, s4, m4, r4, 2)",
    "ln_bwd_noaffine": "lambda: B.layer_normalization_backward(None, xl, dyl, None, ml, rl, 1)",
    "ln_fwd_bf16": "lambda: B.layer_normalization_forward(None, xb, sb, sb, 1, 1e-5)",
    "ln_bwd_bf16": "lambda: B.layer_normalization_backward(None, xb, xb, sb, mb, rb, 1)",
    "gn_fwd": "lambda: B.group_normalization_forward(None, xg, 3, sg, sg, 1e-5)",
    "gn_bwd": "lambda: B.group_normalization_backward(None, xg, xg, 3, sg, mg, rg)",
    "gn_bwd_noaffine": "lambda: B.group_normalization_backward(None, xg, xg, 3, None, mg, rg)",
    "gn_fwd_bf16": "lambda: B.group_normalization_forward(None, xgb, 2, None, None, 1e-5)",
    "ce_fwd": "lambda: B.softmax_cross_entropy_forward(None, xs, t)",
    "ce_bwd": "lambda: B.softmax_cross_entropy_backward(None, xs, t, g0, lse, den)",
    "ce_fwd_opts": "lambda: B.softmax_cross_entropy_forward(None, xs, t, ws, 3, 0.1, 'none')",
    "ce_bwd_opts": "lambda: B.softmax_cross_entropy_backward(None, xs, t, gn, lsen, denn, ws, 3, 0.1, 'none')",
    "ce_fwd_bf16": "lambda: B.softmax_cross_entropy_forward(None, xsb, t, None, -100, 0.2, 'sum')",
    "softmax_fwd": "lambda: B.softmax_forward(None, 'log', None, xs, axis=1)",
    "softmax_bwd": "lambda: B.softmax_backward(None, 'accurate', None, xs, xs, axis=-1)",
}

_ARRAYS = textwrap.dedent("""
    xl, dyl, sl, bl = arr(16, 40), arr(16, 40), arr(40), arr(40)
    _, ml, rl = B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5)
    x4, s4 = arr(2, 3, 4, 5), arr(4, 5)
    _, m4, r4 = B.layer_normalization_forward(None, x4, s4, s4, 2, 1e-5)
    xb, sb = arr(8, 64, dt=BF), arr(64)
    _, mb, rb = B.layer_normalization_forward(None, xb, sb, sb, 1, 1e-5)
    xg, sg = arr(2, 6, 5, 5), arr(6)
    _, mg, rg = B.group_normalization_forward(None, xg, 3, sg, sg, 1e-5)
    xgb = arr(2, 4, 3, 3, dt=BF)
    xs, xsb, ws = arr(12, 10), arr(12, 10, dt=BF), arr(10)
    t = fakecp.asarray(np.arange(12) % 10)
    _, lse, den = B.softmax_cross_entropy_forward(None, xs, t)
    g0 = fakecp.asarray(np.ones((), np.float32))
    ln_, lsen, denn = B.softmax_cross_entropy_forward(None, xs, t, ws, 3, 0.1, 'none')
    gn = fakecp.asarray(np.ones(ln_.shape, np.float32))
    NM._NORM_SEEN.clear(); SM._CE_SEEN.clear(); SM._SEEN.clear()
""")


def test_a_seen_call_skips_the_checks_and_launches_what_the_validated_call_launched():
    body = _ARRAYS + "calls = {\n" + "".join(f"    {k!r}: {v},\n" for k, v in _CALLS.items()) + "}\n" + """
for name, f in calls.items():
    out[name] = [run(f), run(f), run(f)]
"""
    on = _run(body)
    off = _run(body, {"MINIDNN_NORM_SEEN": "0", "MINIDNN_CE_SEEN": "0"})
    for name in _CALLS:
        first, again, third = on[name]
        assert first[0] == 1 and again[0] == 0 and third[0] == 0, (name, first[0], again[0])    # checked once
        assert first[1] and first[1] == again[1] == third[1], name                               # the same launches
        assert first[2] == again[2] == third[2], name                                          # same results
        assert all(r[1] == first[1] and r[2] == first[2] for r in off[name]), name             # as the full path
        if not name.startswith("softmax"):                                                     # (no switch)
            assert [r[0] for r in off[name]] == [1, 1, 1], name


def test_the_launch_scenario_is_the_same_with_the_shortcuts_on_and_off(tmp_path):
    tool = str(ROOT / "tools" / "record_launches.py")
    for name, env in (("on", {}), ("off", {"MINIDNN_NORM_SEEN": "0", "MINIDNN_CE_SEEN": "0"})):
        res = subprocess.run([sys.executable, tool, str(ROOT), str(tmp_path / f"{name}.json")], capture_output=True,
                             text=True, timeout=600, env=dict(os.environ, **env))
        assert res.returncode == 0, res.stderr[-3000:]
    on, off = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("on", "off"))
    assert len(on) > 200 and on == off


def test_a_changed_signature_misses():
    body = _ARRAYS + """
h = B.Handle("cuda:0")
xl_t = fakecp.asarray(np.asarray(xl).T.copy()).T           # (16, 40) strides of a transpose: another signature
variants = {
    "ln_fwd": [lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5),
               lambda: B.layer_normalization_forward(None, xl, sl, None, 1, 1e-5),          # no bias
               lambda: B.layer_normalization_forward(None, xl, None, bl, 1, 1e-5),          # no scale
               lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-3),            # eps
               lambda: B.layer_normalization_forward(None, xl, sl.astype(np.float64), bl.astype(np.float64), 1,
                                                     1e-5),                                 # float64 parameters (ref)
               lambda: B.layer_normalization_forward(None, arr(16, 40, dt=BF), sl, bl, 1, 1e-5),       # x's dtype
               lambda: B.layer_normalization_forward(None, arr(8, 40), sl, bl, 1, 1e-5),    # shape
               lambda: B.layer_normalization_forward(None, arr(2, 8, 40), sl, bl, 1, 1e-5), # rank
               lambda: B.layer_normalization_forward(None, x4, None, None, 1, 1e-5),        # normalized_ndim
               lambda: B.layer_normalization_forward(None, x4, None, None, 2, 1e-5),
               lambda: B.layer_normalization_forward(h, xl, sl, bl, 1, 1e-5),               # a given handle
               lambda: B.layer_normalization_forward(None, xl_t, sl, bl, 1, 1e-5),          # strides (reference)
               ],
    "ln_bwd": [lambda: B.layer_normalization_backward(None, xl, dyl, sl, ml, rl, 1),
               lambda: B.layer_normalization_backward(None, xl, dyl, None, ml, rl, 1),
               lambda: B.layer_normalization_backward(None, xl, dyl, sl, ml.astype(np.float64),
                                                      rl.astype(np.float64), 1),            # stats' dtype (ref)
               lambda: B.layer_normalization_backward(None, xl, dyl, sl, ml, rl, 1, 2.0),   # alpha_data (ref)
               ],
    "gn_fwd": [lambda: B.group_normalization_forward(None, xg, 3, sg, sg, 1e-5),
               lambda: B.group_normalization_forward(None, xg, 2, sg, sg, 1e-5),            # num_groups
               lambda: B.group_normalization_forward(None, xg, 3, sg, sg, 1e-5, 1.0, 0.0, arr(2, 6, 5, 5)),  # y
               lambda: B.group_normalization_forward(None, arr(2, 6, 5, 5, dt=np.float64), 3, None, None,
                                                     1e-5),
               ],
    "gn_bwd": [lambda: B.group_normalization_backward(None, xg, xg, 3, sg, mg, rg),
               lambda: B.group_normalization_backward(None, xg, xg, 3, sg, mg, rg, dscale=arr(6), dbias=arr(6)),
               ],
    "ce_fwd": [lambda: B.softmax_cross_entropy_forward(None, xs, t),
               lambda: B.softmax_cross_entropy_forward(None, xs, t, ws),                    # weight
               lambda: B.softmax_cross_entropy_forward(None, xs, t, None, 3),               # ignore_index
               lambda: B.softmax_cross_entropy_forward(None, xs, t, None, -100, 0.1),       # label_smoothing
               lambda: B.softmax_cross_entropy_forward(None, xs, t, None, -100, 0.0, "sum"),    # reduction
               lambda: B.softmax_cross_entropy_forward(None, xs, t.astype(np.int32)),       # target dtype
               lambda: B.softmax_cross_entropy_forward(None, xsb, t),                       # x dtype
               lambda: B.softmax_cross_entropy_forward(h, xs, t),                           # handle
               ],
    "ce_bwd": [lambda: B.softmax_cross_entropy_backward(None, xs, t, g0, lse, den),
               lambda: B.softmax_cross_entropy_backward(None, xs, t, g0.astype(np.float64), lse, den),  # dloss
               lambda: B.softmax_cross_entropy_backward(None, xs, t, g0, lse, den, None, 5),
               ],
    "softmax": [lambda: B.softmax_forward(None, "log", None, xs, axis=1),
                lambda: B.softmax_forward(None, "log", None, xs, axis=-1),
                lambda: B.softmax_forward(None, "log", None, xs, axis=(1,)),                # a tuple: not cached
                ],
}
for name, fs in variants.items():
    out[name] = [[run(f)[0] for _ in range(2)] for f in fs]
"""
    res = _run(body)
    for name, rows in res.items():
        for i, (first, again) in enumerate(rows):
            assert first == 1, (name, i, first)            # each variant is validated: a miss
    # the cached ones validate once; the ones the kernels do not take (reference) or a tuple axis: every call
    ref = {("ln_fwd", 4), ("ln_fwd", 11), ("ln_bwd", 2), ("ln_bwd", 3), ("gn_fwd", 2), ("gn_bwd", 1), ("softmax", 2)}
    for name, rows in res.items():
        for i, (first, again) in enumerate(rows):
            assert again == (1 if (name, i) in ref else 0), (name, i, again)


def test_bad_input_after_cached_calls_raises_as_the_full_path_and_remembers_nothing():
    body = _ARRAYS + "calls = {\n" + "".join(f"    {k!r}: {v},\n" for k, v in _CALLS.items()) + "}\n" + """
if {warm}:
    for f in calls.values():
        f(); f()
bad = {
    "ln scale shape": lambda: B.layer_normalization_forward(None, xl, arr(41), bl, 1, 1e-5),
    "ln eps < 0": lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, -1e-5),
    "ln eps nan": lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, float("nan")),
    "ln eps complex": lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5 + 0j),
    "ln ndim float": lambda: B.layer_normalization_forward(None, xl, sl, bl, 1.0, 1e-5),
    "ln ndim 3": lambda: B.layer_normalization_forward(None, xl, sl, bl, 3, 1e-5),
    "ln host scale": lambda: B.layer_normalization_forward(None, xl, np.asarray(sl), bl, 1, 1e-5),
    "ln int x": lambda: B.layer_normalization_forward(None, xl.astype(np.int32), None, None, 1, 1e-5),
    "ln beta no y": lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5, 1.0, 1.0),
    "ln bwd dy shape": lambda: B.layer_normalization_backward(None, xl, arr(16, 41), sl, ml, rl, 1),
    "ln bwd dy dtype": lambda: B.layer_normalization_backward(None, xl, dyl.astype(np.float64), sl, ml, rl, 1),
    "ln bwd mean shape": lambda: B.layer_normalization_backward(None, xl, dyl, sl, arr(15), rl, 1),
    "ln bwd mean None": lambda: B.layer_normalization_backward(None, xl, dyl, sl, None, rl, 1),
    "ln bwd beta": lambda: B.layer_normalization_backward(None, xl, dyl, sl, ml, rl, 1, 1.0, 1.0),
    "gn groups": lambda: B.group_normalization_forward(None, xg, 4, sg, sg, 1e-5),
    "gn groups float": lambda: B.group_normalization_forward(None, xg, 3.0, sg, sg, 1e-5),
    "gn 1-d": lambda: B.group_normalization_forward(None, arr(6), 3, None, None, 1e-5),
    "gn scale": lambda: B.group_normalization_forward(None, xg, 3, arr(5), sg, 1e-5),
    "gn bwd stats": lambda: B.group_normalization_backward(None, xg, xg, 3, sg, arr(2, 2), rg),
    "ce smoothing": lambda: B.softmax_cross_entropy_forward(None, xs, t, None, -100, 1.5),
    "ce smoothing complex": lambda: B.softmax_cross_entropy_forward(None, xs, t, None, -100, 0j),
    "ce reduction": lambda: B.softmax_cross_entropy_forward(None, xs, t, reduction="avg"),
    "ce float target": lambda: B.softmax_cross_entropy_forward(None, xs, t.astype(np.float32)),
    "ce target shape": lambda: B.softmax_cross_entropy_forward(None, xs, t[:11]),
    "ce weight": lambda: B.softmax_cross_entropy_forward(None, xs, t, arr(9)),
    "ce weight dtype": lambda: B.softmax_cross_entropy_forward(None, xs, t, ws.astype(np.float64)),
    "ce 1-d": lambda: B.softmax_cross_entropy_forward(None, arr(10), t[:1]),
    "ce bwd lse": lambda: B.softmax_cross_entropy_backward(None, xs, t, g0, lse[:11], den),
    "ce bwd dloss": lambda: B.softmax_cross_entropy_backward(None, xs, t, gn, lse, den),
    "ce bwd host target": lambda: B.softmax_cross_entropy_backward(None, xs, np.asarray(t), g0, lse, den),
    "softmax axis float": lambda: B.softmax_forward(None, "log", None, xs, axis=1.0),
    "softmax axis": lambda: B.softmax_forward(None, "log", None, xs, axis=2),
    "softmax bwd dy": lambda: B.softmax_backward(None, "accurate", None, xs, arr(12, 11), axis=-1),
}
for name, f in bad.items():
    out[name] = error(f)
"""
    warm = _run(body.replace("{warm}", "True"))
    cold = _run(body.replace("{warm}", "False"))
    for name, (kind, msg, grew) in warm.items():
        assert kind != "no error", name
        assert [kind, msg] == cold[name][:2], (name, warm[name], cold[name])    # as a fresh process raises
        assert grew == 0 == cold[name][2], name                                 # nothing remembered


def test_a_seen_call_still_picks_the_kernel_by_alignment():
    """The key holds no address: a misaligned x of a seen signature reaches the kernel module, which picks the
    scalar variant as the full path does."""
    body = """
buf = fakecp.asarray(np.zeros(16 * 64 + 4, np.float32))
aligned = buf[:16 * 64].reshape(16, 64)
mis = buf[1:16 * 64 + 1].reshape(16, 64)               # the same shape, dtype and strides, 4 bytes off
sc = arr(64)
out["hit"] = [run(lambda: B.layer_normalization_forward(None, a, sc, sc, 1, 1e-5))
              for a in (aligned, aligned, mis)]
NM.SEEN_ON[0] = False
out["full"] = [run(lambda: B.layer_normalization_forward(None, a, sc, sc, 1, 1e-5)) for a in (aligned, mis)]
"""
    res = _run(body)
    (c0, l0, _), (c1, l1, _), (c2, l2, _) = res["hit"]
    assert [c0, c1, c2] == [1, 0, 0]
    assert l0 == l1 and l2 != l0                       # the misaligned call launched another variant...
    assert l0 == res["full"][0][1] and l2 == res["full"][1][1]      # ...the one the full path launches


@pytest.mark.parametrize("switch", ["MINIDNN_NORM_SEEN", "MINIDNN_CE_SEEN"])
def test_the_switches_turn_the_shortcuts_off(switch):
    body = _ARRAYS + """
for name, f in (("ln", lambda: B.layer_normalization_forward(None, xl, sl, bl, 1, 1e-5)),
                ("ce", lambda: B.softmax_cross_entropy_forward(None, xs, t))):
    out[name] = [run(f)[0] for _ in range(3)]
"""
    res = _run(body, {switch: "0"})
    off, on = ("ln", "ce") if switch == "MINIDNN_NORM_SEEN" else ("ce", "ln")
    assert res[off] == [1, 1, 1] and res[on] == [1, 0, 0]

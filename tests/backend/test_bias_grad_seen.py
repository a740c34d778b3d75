"""convolution_backward_bias's seen-call shortcut (backend/convolution.py _BIAS_SEEN) on the GPU path, under
tools/record_launches.py's fake CuPy in a subprocess: a repeated signature skips the checks and launches what the
full path launched; another layout, dtype, db_dtype or handle takes the full path; bad input still raises."""
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    import numpy as np
    import minidnn.backend as B
    from minidnn.backend import convolution as CV
    full = [0]
    real_begin = CV.begin
    def begin(*a, **k):
        full[0] += 1
        return real_begin(*a, **k)
    CV.begin = begin
    out = {{}}
    def run(name, dy, **kw):
        recs.clear(); full[0] = 0
        db = B.convolution_backward_bias(None, dy, **kw)
        out[name] = [full[0], [r[0][:40] for r in recs], list(db.shape), str(db.dtype)]
    nchw = fakecp.zeros((8, 6, 5, 5), dtype="float32")
    for i in range(2):
        run(f"nchw{{i}}", nchw)
    cl = fakecp.zeros((8, 5, 5, 6), dtype="float32").transpose(0, 3, 1, 2)
    for i in range(2):
        run(f"cl{{i}}", cl)
    run("f16_wide", fakecp.zeros((8, 6, 5, 5), dtype="float16"), db_dtype=np.float32)
    run("f16_wide_again", fakecp.zeros((8, 6, 5, 5), dtype="float16"), db_dtype=np.float32)
    run("f16", fakecp.zeros((8, 6, 5, 5), dtype="float16"))
    try:
        B.convolution_backward_bias(None, fakecp.zeros((8, 6), dtype="float32"))
        out["bad"] = "no error"
    except Exception as e:
        out["bad"] = type(e).__name__
    print(json.dumps(out))
""")


def test_seen_bias_gradient_calls_skip_the_checks_and_launch_the_same():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for name, first, again in (("nchw", out["nchw0"], out["nchw1"]), ("cl", out["cl0"], out["cl1"]),
                               ("f16_wide", out["f16_wide"], out["f16_wide_again"])):
        assert first[0] == 1 and again[0] == 0, (name, first, again)      # the checks ran once
        assert first[1] == again[1] and first[1], (name, first, again)    # the same launches
        assert first[2:] == again[2:] == [[6], "float32"], (name, first, again)
    assert out["f16"][0] == 1 and out["f16"][3] == "float16"          # another db dtype: the full path
    assert out["bad"] == "BadParamError"

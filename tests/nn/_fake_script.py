"""Runs a fake-CuPy script (tools/record_launches.py's fake, installed in a fresh interpreter) for the nn tests of GPU
host paths: the script formats ``{root}`` and prints one ``RESULT<json>`` line; returns the decoded result."""
import json
import subprocess
import sys
import textwrap

# The scripts' common opening: the fake installed with null pointers and launches recorded as packed records into
# ``recs`` (CuPy operations the fake runs in NumPy recorded as "cupy"), ``R`` tools/record_launches.py, ``np`` NumPy.
FAKE_PROLOGUE = textwrap.dedent("""
    import json, sys, collections, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
""")


def run_fake_script(script: str, root) -> dict:
    r = subprocess.run([sys.executable, "-c", script.format(root=str(root))], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])

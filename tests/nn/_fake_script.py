"""Runs a fake-CuPy script (tools/record_launches.py's fake, installed in a fresh interpreter) for the nn tests of GPU
host paths: the script formats ``{root}`` and prints one ``RESULT<json>`` line; returns the decoded result."""
import json
import subprocess
import sys


def run_fake_script(script: str, root) -> dict:
    r = subprocess.run([sys.executable, "-c", script.format(root=str(root))], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])

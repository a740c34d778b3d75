"""In-process A/B of a session-11 autocast switch on tools/fake_gpu_step.py's training step (fake CuPy: the GPU
path's Python, kernels recorded and never run): the same bf16/fp16 step with the switch off and on, alternated in one
process, so that the shared machine's process-to-process noise cancels.  ms of CPU time per step, min of ROUNDS (15)
alternated rounds of 20 steps each; also gen-0 garbage collections per step with each setting.

    SWITCH=direct: autocast's direct weights (``minidnn._amp_state.DIRECT_WEIGHTS``), the default;
    SWITCH=keep:   autocast's kept flat low-precision copy (``minidnn.amp.autocast_mode.KEEP_LOW_COPY``);
    SWITCH=both:   both off against both on.
    FREE_CAST=1 also makes the kept copy's refill free (the fake would convert in NumPy what astype skips).

    AMP=bf16 FREE_CAST=1 FREE_LT=1 [CL=1] [ROUNDS=15] [SWITCH=keep] python tools/amp_direct_ab.py TREE mobilenet 2
"""
# ruff: noqa: E402  (fake_gpu_step.py installs the fake CuPy before minidnn is imported)
import gc
import os
import runpy
import sys
import time

os.environ["MODE"] = "none"         # fake_gpu_step.py sets up and warms up only
if not os.environ.get("AMP"):
    sys.exit("set AMP=bf16 or AMP=fp16")
g = runpy.run_path(os.path.join(sys.argv[1], "tools", "fake_gpu_step.py"), run_name="fake_gpu_step")
from minidnn import _amp_state
from minidnn.amp import autocast_mode

which = os.environ.get("SWITCH", "direct")
switches = {"direct": [_amp_state.DIRECT_WEIGHTS], "keep": [autocast_mode.KEEP_LOW_COPY],
            "both": [_amp_state.DIRECT_WEIGHTS, autocast_mode.KEEP_LOW_COPY]}[which]
if os.environ.get("FREE_CAST", "") not in ("", "0"):
    autocast_mode._refill = lambda low, fs: None


def set_switch(on):
    for sw in switches:
        sw[0] = on


step = g["step"]
best = {False: 1e9, True: 1e9}
collections = {False: 0, True: 0}
for _ in range(5):
    for on in (False, True):
        set_switch(on)
        step()
rounds = int(os.environ.get("ROUNDS", 15))
for _ in range(rounds):
    for on in (False, True):
        set_switch(on)
        step(), step()
        gc.collect()
        before = gc.get_stats()[0]["collections"]
        t0 = time.process_time()
        for _ in range(20):
            step()
        best[on] = min(best[on], (time.process_time() - t0) / 20)
        collections[on] += gc.get_stats()[0]["collections"] - before
n = rounds * 20
print(f"{g['model']} b{g['batch']} AMP={os.environ['AMP']} CL={int(g['cl'])} SWITCH={which}: "
      f"off {best[False] * 1e3:.3f}, on {best[True] * 1e3:.3f} ms/step, "
      f"saving {(best[False] - best[True]) * 1e3:.3f} ms; gen-0 "
      f"collections a step {collections[False] / n:.3f} -> {collections[True] / n:.3f} (CPU time, fake CuPy)")

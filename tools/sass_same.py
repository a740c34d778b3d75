"""Whether two trees compile the step kernels to the same machine code, on a machine without a GPU: the kernels a
fixed scenario of softmax / log-softmax / cross-entropy / dropout / batch-norm calls plans under the fake CuPy
(tools/record_launches.py) are captured as (source, name, NVRTC options), compiled with nvcc for sm_90, and their
SASS (cuobjdump) hashed.  Equal hashes for a kernel = the same instructions on the GPU: a refactor of a kernel
source that keeps them needs no GPU run to show it changed nothing.

    python tools/sass_same.py TREE OUT.json           # TREE's kernels -> {name + options: SASS hash}
    python tools/sass_same.py --compare A.json B.json  # kernels whose SASS differs (or is in one tree only)
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

# cuobjdump (and the nvdisasm it calls): on PATH, or where $CUOBJDUMP / $NVDISASM_PATH say (e.g. the
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels' bin/)
CUOBJDUMP = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "cuobjdump"


def _sass(code, name, options, tmp):
    defines = [o[2:] for o in options if o.startswith("-D")]
    flags = [o for o in options if not o.startswith("-D")]
    head = "".join("#define {} {}\n".format(*(d.split("=", 1) if "=" in d else (d, "1"))) for d in defines)
    src = os.path.join(tmp, "k.cu")
    with open(src, "w") as f:
        f.write(head + code)
    cubin = os.path.join(tmp, "k.cubin")
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", *flags, "-o", cubin, src], capture_output=True, text=True)
    if r.returncode:
        return "COMPILE ERROR: " + r.stderr[-400:]
    r = subprocess.run([CUOBJDUMP, "-sass", "-fun", name, cubin], capture_output=True, text=True)
    if r.returncode:
        return "CUOBJDUMP ERROR: " + r.stderr[-300:]
    lines = [ln.split("*/", 1)[-1].strip() for ln in r.stdout.splitlines() if "/*" in ln]   # no addresses
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] + f" ({len(lines)} lines)"


def record(tree, path):
    sys.path.insert(0, os.path.join(tree, "tools"))
    import record_launches as R
    fakecp, L = R._install(tree)
    R.numpy_fallback(fakecp)
    L._go = lambda fn, dims, stream, params_ptr: None
    seen = {}
    base = fakecp.RawModule

    class Capturing(base):
        def __init__(self, code, options):
            super().__init__(code, options)
            self.code = code

        def get_function(self, name):
            seen[name + " " + " ".join(self.options)] = (self.code, name, tuple(self.options))
            return super().get_function(name)
    fakecp.RawModule = Capturing
    import ml_dtypes

    import minidnn.backend as B
    from minidnn.backend.cuda import bn_kernels as BK
    from minidnn.backend.cuda import bn_nhwc
    bn_nhwc._smem[0] = (233472, 232448)     # an H100's shared memory: the batch-norm plans as on the GPU
    from minidnn.backend.cuda import dropout_philox as DP
    rng = np.random.default_rng(0)

    def arr(*s, dt=np.float32):
        return fakecp.asarray(rng.standard_normal(s).astype(dt))
    dtypes = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16)
    for dt in dtypes:
        for shape in ((16384, 1000), (64, 4096), (8, 10), (100, 1001)):
            x = arr(*shape, dt=dt)
            for algo in ("log", "accurate"):
                y = B.softmax_forward(None, algo, "instance", x)
                B.softmax_backward(None, algo, "instance", y, x)
            t = fakecp.asarray(np.arange(shape[0]) % shape[1])
            for red in ("mean", "none"):
                for eps in (0.0, 0.1):
                    loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, reduction=red, label_smoothing=eps)
                    g = fakecp.asarray(np.ones(loss.shape, dt))
                    B.softmax_cross_entropy_backward(None, x, t, g, lse, den, reduction=red, label_smoothing=eps)
        for shape in ((4, 5), (3, 16, 7, 7), (128, 64, 56, 56)):
            xd = arr(*shape, dt=dt)
            st, tk = fakecp.zeros((2,), np.uint64), fakecp.zeros((1,), np.uint32)
            yd, kd = DP.dropout_forward(xd, 0.3, 1 / 0.7, st, tk)
            DP.dropout_backward(yd, kd, 1 / 0.7)
        if dt is not np.float16:
            for shape in ((128, 16, 32, 32), (128, 64, 8, 8), (16, 64, 56, 56)):
                xb = arr(*shape, dt=dt)
                pdt = np.float64 if dt is np.float64 else np.float32
                sc, bi = fakecp.asarray(np.ones(shape[1], pdt)), fakecp.asarray(np.zeros(shape[1], pdt))
                for relu, z in ((False, None), (True, None), (True, xb)):
                    y, m, i = BK.forward_training(xb, sc, bi, 0.1, None, None, 1e-5, z=z, relu=relu)
                    BK.backward(xb, xb, sc, m, i, y=y if relu else None, want_dz=z is not None)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, (code, name, options) in sorted(seen.items()):
            out[key] = _sass(code, name, options, tmp)
    json.dump(out, open(path, "w"), indent=0)
    print(f"{len(out)} kernels compiled, {sum(v.startswith('COMPILE') for v in out.values())} compile errors")


def compare(a, b):
    ka, kb = json.load(open(a)), json.load(open(b))
    diff = [k for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
    for k in diff:
        print(f"{k[:150]}\n    {ka.get(k)}  |  {kb.get(k)}")
    print(f"{len(set(ka) & set(kb))} kernels in both, {len(diff)} differ or are in one tree only")
    return 1 if diff else 0


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    record(sys.argv[1], sys.argv[2])

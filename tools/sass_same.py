"""Whether two trees compile the step kernels to the same machine code, on a machine without a GPU: the kernels a
fixed scenario of softmax / log-softmax / cross-entropy (loss_kernels.CE_FWD16 "1" and "0"; 16-bit logits also
widened) / dropout / batch-norm / layer-norm / group-norm calls plans under the fake CuPy
(tools/record_launches.py) are captured as (source, name, NVRTC options), compiled with nvcc for sm_90, and their
SASS (cuobjdump) hashed.  Equal hashes for a kernel = the same instructions on the GPU: a refactor of a kernel
source that keeps them needs no GPU run to show it changed nothing.

    python tools/sass_same.py TREE OUT.json           # TREE's kernels -> {name + options: SASS hash}
    python tools/sass_same.py --compare A.json B.json [NAME=VALUE ...]
        # kernels whose SASS differs (or is in one tree only); NAME=VALUE: a define one tree passes and the other
        # does not (e.g. a define whose only other value went), left out of the keys before they are matched
"""
import concurrent.futures
import hashlib
import itertools
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
    from minidnn.backend.cuda import device_facts
    device_facts._smem[0] = (233472, 232448)     # an H100's shared memory: the batch-norm plans as on the GPU
    from minidnn.backend.cuda import dropout_philox as DP
    from minidnn.backend.cuda import loss_kernels as LK
    from minidnn.backend.cuda import norm_kernels as NK
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
            for fwd16 in ("1", "0"):                  # the default packed 16-bit forward, and session 9's
                LK.CE_FWD16 = fwd16
                LK._plans.clear()
                for red, eps, widen in itertools.product(("mean", "none"), (0.0, 0.1), (False, True)):
                    if widen and np.dtype(dt).itemsize != 2:
                        continue
                    kw = dict(reduction=red, label_smoothing=eps, widen=widen)
                    loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, **kw)
                    g = fakecp.asarray(np.ones(loss.shape, np.float32 if widen else dt))
                    B.softmax_cross_entropy_backward(None, x, t, g, lse, den, **kw)
            LK.CE_FWD16 = "1"
            LK._plans.clear()
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
        pdt = np.float64 if dt is np.float64 else np.float32
        for shape in ((16384, 1024), (64, 4096), (8, 10), (100, 1001), (4, 50, 768)):
            xl = arr(*shape, dt=dt)
            for p in (None, pdt, dt):                # no affine, float32 parameters, parameters of x's dtype
                sc = None if p is None else fakecp.asarray(np.ones(shape[-1], p))
                bi = None if p is None else fakecp.asarray(np.zeros(shape[-1], p))
                y, mu, rs = NK.layer_norm_forward(xl, 1, sc, bi, 1e-5)
                NK.layer_norm_backward(xl, xl, 1, sc, mu, rs)
        for shape, groups in (((128, 64, 56, 56), 32), ((16, 32, 8, 8), 8), ((4, 6, 5, 5), 3), ((8, 256, 4, 4), 4)):
            xg = arr(*shape, dt=dt)
            for p in (None, pdt):
                sc = None if p is None else fakecp.asarray(np.ones(shape[1], p))
                bi = None if p is None else fakecp.asarray(np.zeros(shape[1], p))
                y, mu, rs = NK.group_norm_forward(xg, groups, sc, bi, 1e-5)
                NK.group_norm_backward(xg, xg, groups, sc, mu, rs)
    keys = sorted(seen)

    def one(i):                     # nvcc and cuobjdump are processes: a thread each keeps the cores busy
        with tempfile.TemporaryDirectory() as tmp:
            return _sass(*seen[keys[i]], tmp)
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        out = dict(zip(keys, pool.map(one, range(len(keys)))))
    json.dump(out, open(path, "w"), indent=0)
    print(f"{len(out)} kernels compiled, {sum(v.startswith('COMPILE') for v in out.values())} compile errors")


def _drop(keys, ignore):
    out = {" ".join(w for w in k.split(" ") if w[2:] not in ignore): v for k, v in keys.items()}
    if len(out) != len(keys):
        sys.exit(f"leaving out {sorted(ignore)} makes two kernels' keys one: not a define that went")
    return out


def compare(a, b, ignore=()):
    ka, kb = _drop(json.load(open(a)), ignore), _drop(json.load(open(b)), ignore)
    diff = [k for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
    for k in diff:
        print(f"{k[:150]}\n    {ka.get(k)}  |  {kb.get(k)}")
    print(f"{len(set(ka) & set(kb))} kernels in both, {len(diff)} differ or are in one tree only")
    return 1 if diff else 0


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], set(sys.argv[4:])))
    record(sys.argv[1], sys.argv[2])

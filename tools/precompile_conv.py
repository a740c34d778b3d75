"""Compile every implicit-GEMM configuration (conv_igemm.igemm_options: directions x dtypes x math x tiles x
loaders) into CuPy's on-disk cache with one process per core, so that a test or benchmark run that follows in the
same CUPY_CACHE_DIR loads cubins instead of running NVRTC ~100 times one after another.

    CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONPATH=. python3 tools/precompile_conv.py [--procs 16]

--bn compiles instead the fused forward kernels (EPI=1 with the batch-norm prologue PRO=1 and/or statistics
STATS=1) that tests/backend/test_conv_epilogue_bn_cuda.py and tools/conv_epilogue_bench.py --bn launch: their
options are recorded by making the same primitive calls under tools/record_launches.py's fake CuPy (a subprocess;
nothing runs), then compiled like the rest.  --bn --list prints them.
"""
from __future__ import annotations

import argparse
import ast
import itertools
import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _configs():
    from minidnn.backend.cuda import conv_igemm as K
    out = []
    for d, tile in itertools.product((0, 1, 2), K.TILES):
        for dt, tf32 in (("float32", False), ("float32", True), ("float16", True), ("bfloat16", True)):
            for vec in (False, True) + (("krsc",) if d == 1 else ()):
                out.append(K.igemm_options(d, dt, tf32, tile, vec)[0])
    return out


ROOT = Path(__file__).resolve().parents[1]


def _bn_configs():
    """The fused kernels' options the batch-norm fusions' cuda tests and bench launch (``_record_bn``)."""
    res = subprocess.run([sys.executable, __file__, "--record-bn"], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return [list(o) for o in json.loads(res.stdout.strip().splitlines()[-1])]


def _test_table(name):
    """A module-level literal (SHAPES, HALF_SHAPES) of test_conv_epilogue_bn_cuda.py, read without importing it
    (it skips at import without a GPU)."""
    tree = ast.parse((ROOT / "tests/backend/test_conv_epilogue_bn_cuda.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def _record_bn():
    """Under the fake CuPy: the calls of the bn cuda tests and of the bench's --bn, recording every implicit-GEMM
    kernel's options; prints them as JSON."""
    sys.path.insert(0, str(ROOT / "tools"))
    import record_launches as R
    fakecp, L = R._install(str(ROOT))
    import ml_dtypes
    import numpy as np
    seen = []
    get_kernel = L.get_kernel

    def recording(source, name, options=()):
        if name == "conv_igemm" and tuple(options) not in seen:
            seen.append(tuple(options))
        return get_kernel(source, name, options)
    L.get_kernel = recording
    L._go = lambda *a: None
    from conv_epilogue_bench import BN_LAYERS

    import minidnn.backend as B
    relu, ident = B.ActivationDescriptor("relu"), B.ActivationDescriptor("identity")
    PRECOMP, IMPLICIT = B.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, B.ConvolutionFwdAlgo.IMPLICIT_GEMM
    maths = {"fp32": (np.float32, B.MathType.DEFAULT), "tf32": (np.float32, B.MathType.TENSOR_OP),
             "bf16": (ml_dtypes.bfloat16, B.MathType.DEFAULT), "fp16": (np.float16, B.MathType.DEFAULT)}

    def arrays(xs, ws, dt, fmt, pad=1, stride=1, dil=1, groups=1, mt=B.MathType.DEFAULT, w_channels_last=False):
        desc = B.ConvolutionDescriptor(pad, stride, dil, groups, math_type=mt)
        x = np.zeros(xs, dt)
        if fmt == "NHWC":
            x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        w = fakecp.asarray(np.zeros(ws, dt))
        if w_channels_last:
            w = fakecp.asarray(np.ascontiguousarray(np.moveaxis(np.zeros(ws, dt), 1, -1))).transpose(0, 3, 1, 2)
        ys = B.get_convolution_forward_output_dim(desc, x.shape, ws, format=fmt)
        K, C = ws[0], xs[1]
        return (desc, fakecp.asarray(x), w, fakecp.asarray(np.zeros(ys, dt)), fakecp.asarray(np.zeros(K, dt)),
                fakecp.asarray(np.ones(C, np.float32)), fakecp.asarray(np.zeros(C, np.float32)),
                (fakecp.zeros(K, np.float32), fakecp.zeros(K, np.float32)))

    # tools/conv_epilogue_bench.py --bn
    for math in ("fp32", "tf32", "bf16"):
        dt, mt = maths[math]
        h = B.Handle("cuda", math_type=mt)
        for fmt in ("NCHW", "NHWC"):
            for _, xs, ws, pad in BN_LAYERS:
                desc, x, w, _, _, sc, sh, st = arrays(xs, ws, dt, fmt, pad, mt=mt, w_channels_last=fmt == "NHWC")
                B.convolution_bias_activation_forward(h, x, w, desc, None, None, 1.0, 0.0, None, ident, format=fmt,
                                                      stats=st)
                B.scale_bias_activation_convolution_forward(h, x, sc, sh, relu, w, desc, format=fmt, stats=st)
    # tests/backend/test_conv_epilogue_bn_cuda.py
    shapes, halves = _test_table("SHAPES"), _test_table("HALF_SHAPES")
    for shape in shapes:
        _, xs, ws, pad, stride, dil, groups = shape
        for fmt in ("NCHW", "NHWC"):
            for math, (dt, mt) in maths.items():
                if math not in ("fp32", "tf32") and shape[0] not in halves:
                    continue
                desc, x, w, z, b, sc, sh, st = arrays(xs, ws, dt, fmt, pad, stride, dil, groups, mt)
                algo = PRECOMP if fmt == "NCHW" else IMPLICIT
                B.scale_bias_activation_convolution_forward(B.Handle("cuda"), x, sc, sh, relu, w, desc, algo,
                                                            format=fmt, z=z, alpha1=0.75, alpha2=-0.5, bias=b,
                                                            activation_desc=relu, stats=st)
            for mt in (B.MathType.DEFAULT, B.MathType.TENSOR_OP):       # statistics alone; the remembered call
                desc, x, w, z, b, sc, sh, st = arrays(xs, ws, np.float32, fmt, pad, stride, dil, groups, mt)
                h = B.Handle("cuda", math_type=mt)
                for stats in (st, None):
                    B.convolution_bias_activation_forward(h, x, w, desc, None, z, 0.75, -0.5, b, relu, format=fmt,
                                                          stats=stats)
                B.scale_bias_activation_convolution_forward(h, x, sc, sh, relu, w, desc, None, format=fmt, z=z,
                                                            alpha1=0.75, alpha2=-0.5, bias=b, activation_desc=relu,
                                                            stats=st)
                for pro in (ident, relu):                                # the identity-prologue test
                    B.scale_bias_activation_convolution_forward(None, x, sc, sh, pro, w, desc, None, format=fmt,
                                                                stats=st)
    for fmt in ("NCHW", "NHWC"):                                         # the padding test
        desc, x, w, _, _, sc, sh, st = arrays((2, 8, 5, 6), (3, 8, 3, 3), np.float32, fmt)
        for algo in (IMPLICIT, PRECOMP):
            B.scale_bias_activation_convolution_forward(None, x, sc, sh, relu, w, desc, algo, format=fmt, stats=st)
    print(json.dumps(seen))


def _compile(opts):
    import cupy as cp

    from minidnn.backend.cuda.conv_igemm_source import SOURCE
    cp.RawModule(code=SOURCE, options=tuple(opts)).get_function("conv_igemm")
    return opts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=min(16, mp.cpu_count()))
    ap.add_argument("--bn", action="store_true", help="the batch-norm fusions' kernels (tests and bench)")
    ap.add_argument("--list", action="store_true", help="print the configurations, compile nothing")
    ap.add_argument("--record-bn", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.record_bn:
        return _record_bn()
    configs = _bn_configs() if args.bn else _configs()
    if args.list:
        for c in configs:
            print(" ".join(c))
        print(f"{len(configs)} configurations")
        return
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.procs) as pool:
        for _ in pool.imap_unordered(_compile, configs):
            pass
    print(f"precompiled {len(configs)} implicit-GEMM configurations in {time.perf_counter() - t0:.1f} s "
          f"({args.procs} processes)")


if __name__ == "__main__":
    main()

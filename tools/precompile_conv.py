"""Compile every implicit-GEMM configuration (conv_igemm.igemm_options: directions x dtypes x math x tiles x
loaders) into CuPy's on-disk cache with one process per core, so that a test or benchmark run that follows in the
same CUPY_CACHE_DIR loads cubins instead of running NVRTC ~100 times one after another.

    CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONPATH=. python3 tools/precompile_conv.py [--procs 16]
"""
from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
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


def _compile(opts):
    import cupy as cp

    from minidnn.backend.cuda.conv_igemm_source import SOURCE
    cp.RawModule(code=SOURCE, options=tuple(opts)).get_function("conv_igemm")
    return opts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=min(16, mp.cpu_count()))
    args = ap.parse_args()
    configs = _configs()
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.procs) as pool:
        for _ in pool.imap_unordered(_compile, configs):
            pass
    print(f"precompiled {len(configs)} implicit-GEMM configurations in {time.perf_counter() - t0:.1f} s "
          f"({args.procs} processes)")


if __name__ == "__main__":
    main()

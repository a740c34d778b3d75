"""Which 1x1 convolutions of a model's eager step take conv_pointwise's cublasLt products on this GPU, and why the
others do not (session 9: the fake CuPy step showed every pointwise call as a product, the GPU's launch count did
not drop as much).

    python tools/pw_calls.py [--models mobilenet] [--amp fp32,bf16]

Prints, after warm-up steps: every settled implicit-GEMM call (direction, problem, the call's type), the calls
conv_pointwise declined with the reason (layout, alignment, cublasLt offering no algorithm), and how often a
GemmCall fell back to the kernel for misaligned pointers.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import amp_step  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402
from minidnn.backend.cuda import conv_pointwise as PW  # noqa: E402
from minidnn.backend.cuda import cublas as CB  # noqa: E402

declined = collections.Counter()
fallbacks = collections.Counter()


def _desc(p):
    return f"N{p.N} C{p.C} K{p.K} {'x'.join(map(str, p.in_size))} k{'x'.join(map(str, p.kernel))} " \
           f"s{'x'.join(map(str, p.stride))} g{p.groups} {p.dtype}"


def _lay(a):
    return "C" if a.flags.c_contiguous else "NHWC" if a.ndim == 4 and a.transpose(0, 2, 3, 1).flags.c_contiguous \
        else "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mobilenet")
    ap.add_argument("--amp", default="fp32,bf16")
    args = ap.parse_args()
    orig_settle, orig_prep, orig_call = PW.settle, CB._lt_prepare, PW.GemmCall.__call__
    state = {}

    def settle(direction, p, a, b, out, tf32, alpha, beta, fallback):
        r = orig_settle(direction, p, a, b, out, tf32, alpha, beta, fallback)
        if r is None and PW.supports(p) is None:
            why = state.pop("why", "layout/alignment (before cublasLt)")
            declined[(direction, _desc(p), _lay(a), _lay(b), _lay(out), str(out.dtype), a.data.ptr % 256,
                      b.data.ptr % 256, out.data.ptr % 256, why)] += 1
        state.pop("why", None)
        return r

    def prep(*a, **k):
        r = orig_prep(*a, **k)
        if r is None:
            state["why"] = f"cublasLt: no algorithm (batch={k.get('batch', a[9] if len(a) > 9 else None)})"
        return r

    def call(self, cp, a, b, out, extra=(), carry=None):
        if (a.data.ptr | b.data.ptr | out.data.ptr) & PW._ALIGN:
            fallbacks[(a.shape, b.shape, out.shape, a.data.ptr % 256, b.data.ptr % 256, out.data.ptr % 256)] += 1
        return orig_call(self, cp, a, b, out, extra, carry)
    PW.settle, CB._lt_prepare, PW.GemmCall.__call__ = settle, prep, call
    K._pointwise.settle = settle
    for name in args.models.split(","):
        for mode in args.amp.split(","):
            K._calls.clear()
            declined.clear()
            fallbacks.clear()
            step = amp_step.minidnn_step(name, mode, "cuda")
            for _ in range(3):
                step()
            mdn.cuda.synchronize()
            print(f"== {name} {mode}: settled implicit-GEMM calls")
            for key, c in K._calls.items():
                if isinstance(key, tuple) and len(key) > 1 and hasattr(key[1], "kernel"):
                    print(f"  dir {key[0]} {_desc(key[1])}: {type(c).__name__}")
            for k, n in declined.items():
                print(f"  DECLINED x{n}: {k}")
            for k, n in fallbacks.items():
                print(f"  FELL BACK (misaligned) x{n}: {k}")


if __name__ == "__main__":
    main()

"""backend/cuda/cublas.py ``_LtCall.run`` (docs/host_overhead.md round 24): alpha's and beta's addresses, the
workspace pointer and the bound cublasLtMatmul are read once when the call is prepared; a run passes cublasLtMatmul
the same 16 arguments as before (checked against the formula written out), sets the descriptor's bias pointer only
when it changes, still sees alpha / beta rewritten in place (conv_pointwise does), and raises on a failed status.  On
the CPU: a stand-in cuBLASLt library (Python functions recording their arguments), no CuPy."""
import ctypes
import types

import pytest

from minidnn.backend.cuda import cublas


class _Lib:
    """Records every call; the Create functions write a handle value through their byref argument."""

    def __init__(self):
        self.calls = []
        self.status = 0
        self.next = 0x1000

    def _create(self, name):
        def f(ref, *rest):
            self.next += 0x100
            ref._obj.value = self.next
            self.calls.append((name, self.next))
            return 0
        return f

    def __getattr__(self, name):
        if name.endswith("Create"):
            return self._create(name)
        if name == "cublasLtMatmulAlgoGetHeuristic":
            def heuristic(*args):
                args[-1]._obj.value = 1         # one algorithm found
                return 0
            return heuristic
        if name == "cublasLtMatmul":
            def matmul(*args):
                self.calls.append((name, args))
                return self.status
            return matmul

        def setter(*args):
            self.calls.append((name, args[:2] + (ctypes.cast(args[2], ctypes.POINTER(ctypes.c_uint64))[0]
                                                 if name.endswith("DescSetAttribute") else None,)))
            return 0
        return setter


def _arr(ptr):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def _call(lib):
    ws = _arr(0x7000)
    return cublas._LtCall(lib, 0x42, ws, 8, 6, 5, cublas._OP_N, 6, cublas._OP_N, 5, 0, 0, cublas._COMPUTE_32F,
                          cublas._EPI_BIAS), ws


def test_run_passes_the_same_arguments_and_sets_the_bias_once():
    lib = _Lib()
    call, ws = _call(lib)
    a, b, out, bias = _arr(0xA000), _arr(0xB000), _arr(0xC000), _arr(0xD000)
    for stream in (0, 0x55, 0x55):
        lib.calls.clear()
        call.run(a, b, out, bias, stream)
        matmuls = [c for c in lib.calls if c[0] == "cublasLtMatmul"]
        sets = [c for c in lib.calls if c[0] == "cublasLtMatmulDescSetAttribute"]
        assert len(matmuls) == 1
        expected = (call.handle, call.desc, ctypes.addressof(call.alpha), 0xB000, call.la, 0xA000, call.lb,
                    ctypes.addressof(call.beta), 0xC000, call.lc, 0xC000, call.lc, call.algo, ws.data.ptr,
                    cublas._WORKSPACE_BYTES, stream)
        assert matmuls[0][1] == expected
        # the bias pointer (attribute 8) is written on the first run only: the same bias array after that
        assert sets == ([("cublasLtMatmulDescSetAttribute", (call.desc, 8, 0xD000))] if stream == 0 else [])
    lib.calls.clear()
    call.run(a, b, out, _arr(0xE000), 0)        # another bias: written again
    assert ("cublasLtMatmulDescSetAttribute", (call.desc, 8, 0xE000)) in lib.calls


def test_alpha_beta_rewritten_in_place_are_what_the_run_passes():
    lib = _Lib()
    call, _ = _call(lib)
    call.alpha.value, call.beta.value = 2.5, 1.0       # conv_pointwise's blend
    call.run(_arr(0xA000), _arr(0xB000), _arr(0xC000), None, 0)
    args = [c for c in lib.calls if c[0] == "cublasLtMatmul"][0][1]
    assert ctypes.c_float.from_address(args[2]).value == 2.5
    assert ctypes.c_float.from_address(args[7]).value == 1.0


def test_a_failed_status_raises():
    lib = _Lib()
    call, _ = _call(lib)
    lib.status = 13
    with pytest.raises(RuntimeError, match="cublasLtMatmul failed with cuBLAS status 13"):
        call.run(_arr(0xA000), _arr(0xB000), _arr(0xC000), None, 0)

"""A whole eager training step (forward, cross-entropy, zero_grad, backward, SGD momentum) of LeNet-5, ResNet-20 or
MobileNet-small on "cuda" under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded and never run;
CuPy functions the fake lacks fall back to NumPy): the host Python of the GPU step, measurable without a GPU
(docs/host_overhead.md round 8).  The fake's allocation and launch cost ~nothing, so this is the framework's Python.

    MODE=count python tools/fake_gpu_step.py TREE resnet20 128   # launches, cupy.empty/zeros/.../cuda.alloc per step by caller
    MODE=time  python tools/fake_gpu_step.py TREE resnet20 2     # ms of CPU time per step (fastest of 7 x 20)
    MODE=prof  [SORT=cumulative N=60 NOGC=1] python tools/fake_gpu_step.py TREE resnet20 2   # cProfile of 20 steps
    MODE=trace [CCALLS=1] [TRACE_OUT=file] python tools/fake_gpu_step.py TREE resnet20 2   # one step's calls as a tree
    MODE=opcodes [N=50] python tools/fake_gpu_step.py TREE resnet20 2   # Python opcodes a step by function
    MODE=instr [SW=module:NAME,..] python tools/fake_gpu_step.py TREE resnet20 2   # instructions a step (callgrind,
        switches off / on alternated three times, 3 steps each; the ratio from the last two): the measure that the shared cores' load does not move;
        PAIR=amp AMP=bf16: "off" is the step without autocast, "on" with it (the bf16 extra)
    MODE=callers PAT=device_of,resolve_handle python tools/fake_gpu_step.py TREE      # who calls them
    MODE=gc python tools/fake_gpu_step.py TREE lenet5 64   # the cyclic garbage collector's collections and time a step
    MODE=cycles python tools/fake_gpu_step.py TREE resnet20 8   # objects a step leaves in reference cycles, by type
    MODE=calls python tools/fake_gpu_step.py TREE     # µs per call of round 8's device check, handle, enum keys
    MODE=copies python tools/fake_gpu_step.py TREE resnet20 8    # the engine's leaf-gradient copies and gradient sums
    MODE=record OUT=a.json python tools/fake_gpu_step.py TREE resnet20 128   # one step's launches (kernel, grid,
        packed arguments, array pointers read as 0; the third step, after two warm-ups): compare two trees' records
        with `python tools/record_launches.py --compare a.json b.json`
    MODE=amp_ab AMP=bf16 python tools/fake_gpu_step.py TREE resnet20 2   # in-process A/B of the whole-flat-buffer
        weight cast (minidnn._amp_state's flat caster on / off): ms per step, min of 15 alternated rounds of 20 steps
    MODE=cl_ab [AMP=bf16] python tools/fake_gpu_step.py TREE resnet20 2   # in-process A/B of the same model laid
        out NCHW and channels_last (same seed, own optimizers): ms per step, min of 15 alternated rounds of 20 steps
    MODE=layers [AMP=bf16] [PAIR=amp] python tools/fake_gpu_step.py TREE resnet20 2  # the same pair (PAIR=amp: the
        step without / with autocast instead, CL as set), µs a step per leaf module's
        forward, per backward node, leaf accumulation, the engine's gradient sums and its own rest, loss and optimizer
        (the garbage collector off while timed: MODE=gc counts its collections);
        WRAP=minidnn.backend.cuda.act_kernels:_Plan.__call__,... times those too (module:Class.method or
        module:function; callers that imported a function by name keep the unwrapped one)
    MODE=sw_ab SW=minidnn.backend.cuda.conv_igemm:DW_SETTLE[,module:NAME...] python tools/fake_gpu_step.py TREE mobilenet 128
        # in-process A/B of one-element-list switches (all False / all True): ms per step, min of ROUNDS (15)
        alternated rounds of 20 steps
    MODE=amp_vs_fp32 AMP=bf16 python tools/fake_gpu_step.py TREE mobilenet 128   # in-process A/B of the same step
        with autocast enabled / disabled (the fp32 step): ms per step, min of 15 alternated rounds of 20 steps
    FREE_LT=1 (any mode): the fake's cublasLt products do no NumPy matmul (the fake's cost, not ours).
    FREE_REFILL=1 (not with MODE=record / count): autocast's kept-copy refill skipped (NumPy's conversion of the flat
        buffer is the fake's cost; on a GPU it is one copy launch).
    LEAN_FAKE=1 (any mode): the fake's `a.data` and `a.data.ptr` read at C speed, as CuPy's, and its current
        stream one object (the fake's Python property, cached pointer and a new stream namespace a call were ~24%
        of the fake step: host round 30); the same pointers and launch records.  LEAN_FAKE=2: besides, every
        address read from the array object's data field (a bfloat16 array's as cheap as a float32 one's, as in
        CuPy; round 31: under LEAN_FAKE=1 part of the bf16 step's extra was the fake's).
    FREE_CAST=1 (any mode): the fake's astype allocates the result and converts nothing (a GPU cast is one launch
        whatever its size; NumPy's bfloat16 conversion of a b128 input costs the fake ~0.1 ms that no GPU host pays).
    PROF_OUT=file (MODE=prof): also dump the cProfile stats there (pstats), to diff two configurations.
    AMP=bf16|fp16 (any mode): the forward and loss under minidnn.autocast("cuda", dtype=...), as bench/amp_step.py
        (fp16 without the GradScaler); CL=1: model and input channels_last.
    MODE=count also counts the CuPy operations the fake runs in NumPy (each a CuPy kernel launch on a GPU: ufuncs
        and reductions, astype, copy, fill, x[k] = v), by kind and by caller; MODE=record lists them as
        ("cupy:<op> <dtypes>", [], "") in order among the kernels, and KERNELS=1 prints the record one line a launch.
"""
# ruff: noqa: E402, E501, E701, E702, E731  (a measuring script, set up in order: the fake before minidnn)
import collections
import os
import sys
import time
import types

import numpy as np

tree = sys.argv[1]; model = sys.argv[2] if len(sys.argv) > 2 else "resnet20"
sys.path.insert(0, tree + "/tools"); sys.path.insert(0, tree + "/bench")
import record_launches as R

fakecp, L = R._install(tree)
L._go = lambda fn, dims, stream, params_ptr: None
w = lambda a: a.view(fakecp.ndarray) if isinstance(a, np.ndarray) else a
R.numpy_fallback(fakecp)
print("ok")
fakecp.float32 = np.float32
_M = type(fakecp.empty((1,)).data)
_M.copy_from_device_async = lambda self, src, n, stream=None: None
# LEAN_FAKE=1: the fake's `a.data` / `a.data.ptr` at C speed (CuPy's are C attributes).  The fake's own `data`
# property (a Python function a read, ~1,300 reads a ResNet-20 step) and `_Mem.ptr` (functools.cached_property:
# a lock and __array_interface__ per array) were ~20% of the fake step's CPU time (host round 30, sampled); here
# `data` reads the instance's `_m` (the fake's own key: MODE=record's null pointers still land) through
# operator.attrgetter, the first read of an array making it (the class's __getattr__: the same _Mem, its pointer
# read then); `cupy.cuda.get_current_stream()` one object, as CuPy's, not a new namespace a call.  Same values:
# launch records agree.
if os.environ.get("LEAN_FAKE", "") not in ("", "0"):
    import ctypes
    import operator
    _unexported = set()         # dtypes numpy cannot export as a buffer (ml_dtypes' bfloat16)
    def _first_data(self, name, _at=ctypes.addressof, _buf=ctypes.c_char.from_buffer):
        if name != "_m":
            raise AttributeError(f"'ndarray' object has no attribute {name!r}")
        m = _M(self)
        try:        # the address of a writable C-contiguous buffer, ~2x faster than __array_interface__, whose
            # typestr / descr build strings and import a module (~10% of the step); a bfloat16 array through its
            # bytes' view (+10% of a bf16 step's instructions through the interface)
            ptr = _at(_buf(self.view(np.uint8) if self.dtype in _unexported else self))
        except (TypeError, ValueError) as e:
            if "cannot include dtype" in str(e) and self.dtype not in _unexported:
                _unexported.add(self.dtype)
                return _first_data(self, name)
            ptr = self.__array_interface__["data"][0]   # (strided, read-only or empty: the interface)
        m.__dict__["ptr"] = ptr
        self.__dict__["_m"] = m
        return m
    if os.environ["LEAN_FAKE"] == "2":
        # LEAN_FAKE=2 (host round 31): every address read from the array object's own data pointer field
        # (PyArrayObject's first after the object header) -- no buffer export, no bytes' view for a bfloat16 array,
        # no numpy ``ctypes`` object in cupy.cuda.MemoryPointer -- so that an array's pointer costs the same whatever
        # its dtype, as CuPy's does (under LEAN_FAKE=1 a bf16 array's first pointer made a view: part of the
        # measured "bf16 extra" was the fake's); the same addresses (checked against __array_interface__ here)
        _head = object.__basicsize__
        def _addr(a, _at=ctypes.c_void_p.from_address):
            return _at(id(a) + _head).value or 0
        _probe = np.arange(8, dtype=np.float32)[3:]
        assert _addr(_probe) == _probe.__array_interface__["data"][0]
        def _first_data(self, name, _at=ctypes.c_void_p.from_address):
            if name != "_m":
                raise AttributeError(f"'ndarray' object has no attribute {name!r}")
            m = _M(self)
            m.__dict__["ptr"] = _at(id(self) + _head).value or 0
            self.__dict__["_m"] = m
            return m
        _Block = type(fakecp.cuda.MemoryPointer(np.zeros(8, np.uint8), 0))
        def _memory_pointer(mem, offset, _B=_Block, _new=object.__new__):
            b = _new(_B)
            b.raw, b.offset = mem, -_addr(mem) % 512 + offset
            return b
        fakecp.cuda.MemoryPointer = _memory_pointer
    fakecp.ndarray.__getattr__ = _first_data
    fakecp.ndarray.data = property(operator.attrgetter("_m"))
    _null_stream = types.SimpleNamespace(ptr=0)     # (CuPy hands back its one Stream object, not a new one a call)
    fakecp.cuda.get_current_stream = lambda: _null_stream

fakecp.cuda.Stream = types.SimpleNamespace
# FREE_LT: the fake's cublasLt product does no NumPy matmul (~0.4 ms a LeNet b64 step here): our Python only
if os.environ.get("FREE_LT", "") not in ("", "0"):
    from minidnn.backend.cuda import cublas as _c
    _c._LtCall.run = lambda self, a, b, out, vec, stream: None
if os.environ.get("FREE_CAST", "") not in ("", "0"):
    def _free_astype(self, dtype, *a, **k):
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not k.get("copy", True):
            return self
        return np.empty_like(self, dtype=dtype)     # the same layout (CuPy's astype keeps it), values not converted
    fakecp.ndarray.astype = _free_astype
import minidnn as mdn
import minidnn.models as M

# FREE_REFILL=1: autocast's kept-copy refill (one elementwise copy launch on a GPU) converts nothing: NumPy's
# float32 -> bfloat16 of the flat buffer is the fake's cost (~0.2 ms a ResNet-20 step), not ours; the launch goes
# unrecorded
if os.environ.get("FREE_REFILL", "") not in ("", "0"):
    import minidnn.amp.autocast_mode as _am
    _am._refill = lambda low, fs: None

ctor = {"resnet20": ("resnet20(num_classes=10)", (3, 32, 32), 128), "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=32)", (1, 32, 32), 64),
        "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 32, 32), 128)}[model]
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 2
mdn.manual_seed(0)
m = eval(ctor[0], vars(M)).to("cuda")
amp = os.environ.get("AMP", "").lower()
amp = "" if amp in ("off", "0", "none", "fp32") else amp
if amp not in ("bf16", "fp16", ""):
    sys.exit(f"AMP={amp!r}: use bf16, fp16, or off")
amp_dtype = {"bf16": mdn.bfloat16, "fp16": mdn.float16, "": None}[amp]
cl = os.environ.get("CL", "") not in ("", "0")
if cl:
    m.to(memory_format=mdn.channels_last)
opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = mdn.randn(batch, *ctor[1]).to("cuda")
x = x.to(memory_format=mdn.channels_last) if cl else x
y = mdn.randint(0, 10, (batch,)).to("cuda")
F = mdn.nn.functional
STEP = os.environ.get("STEP", "")       # "plain": no autocast block; "amp_bench": bench/amp_step.py's step (autocast
scaler = mdn.amp.GradScaler("cuda", enabled=amp == "fp16")     # and GradScaler, disabled for fp32)
def step():
    if STEP == "plain":
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return
    with mdn.autocast("cuda", dtype=amp_dtype or mdn.bfloat16, enabled=amp_dtype is not None):
        loss = F.cross_entropy(m(x), y)
    opt.zero_grad()
    if STEP == "amp_bench":
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return
    loss.backward()
    opt.step()
cupy_ops = collections.Counter()       # (op, caller) -> count, while cupy_log is on
cupy_log = [False, None]                # counting on; the record list (MODE=record)
def _dts(arrays):
    return ",".join(str(a.dtype) for a in arrays if isinstance(a, np.ndarray))
def _note(op, arrays):
    if not cupy_log[0]:
        return
    fr = sys._getframe(2)
    while fr.f_code.co_filename == __file__ or "/numpy/" in fr.f_code.co_filename:
        fr = fr.f_back
    cupy_ops[(op, fr.f_code.co_filename.replace(tree + "/", "") + ":" + str(fr.f_lineno) + " " + fr.f_code.co_name)] += 1
    if cupy_log[1] is not None:
        cupy_log[1].append((f"cupy:{op} {_dts(arrays)}", [], ""))
_nd = fakecp.ndarray
def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    _note(f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__, inputs)
    args = [np.asarray(a) if isinstance(a, _nd) else a for a in inputs]
    if "out" in kwargs:
        kwargs["out"] = tuple(np.asarray(a) if isinstance(a, _nd) else a for a in kwargs["out"])
    r = getattr(ufunc, method)(*args, **kwargs)
    if "out" in kwargs:
        r = tuple(a.view(_nd) for a in kwargs["out"]) if isinstance(r, tuple) else kwargs["out"][0].view(_nd)
        return r
    return tuple(w(a) for a in r) if isinstance(r, tuple) else w(r)
def _counted(name):
    f = getattr(np.ndarray, name)
    def g(self, *a, **k):
        if name != "astype":
            _note(name, (self,))
        elif k.get("copy", True) or np.dtype(a[0]) != self.dtype:
            _note(f"astype->{np.dtype(a[0])}", (self,))
        return f(self, *a, **k)
    setattr(_nd, name, g)
from minidnn.backend.cuda import cublas as _cublas

_fake_gemm = _cublas.gemm
def _gemm(a, b, tf32=False, out_dtype=None):    # cuBLAS writes the operands' dtype (or out_dtype); one launch
    on = cupy_log[0]
    cupy_log[0] = False
    try:
        r = _fake_gemm(a, b, tf32)
    finally:
        cupy_log[0] = on
    if cupy_log[1] is None:     # MODE=record lists the gemm as the fake's count_launches entry
        _note("cublas gemm", (a, b))
    want = a.dtype if out_dtype is None else np.dtype(out_dtype)
    return r if r.dtype == want else w(np.asarray(r).astype(want))
_cublas.gemm = _gemm
if os.environ.get("MODE", "count") in ("count", "record"):    # the hooks cost host time: not in MODE=time/prof
    _nd.__array_ufunc__ = _array_ufunc
    for _name in ("astype", "copy", "fill", "__setitem__"):
        _counted(_name)
step(); step()
for _ in range(int(os.environ.get("EXTRA_WARM", "0"))): step()
print("stepped")
mode = os.environ.get("MODE", "count")
if mode == "record":
    import json
    R._zero_pointers(fakecp, L)
    out = R.record_packed(L, [], other="cupy")    # the warm-up steps' argument buffers sized too
    cupy_log[:] = [True, out]
    step()
    cupy_log[:] = [False, None]
    if os.environ.get("OUT"):
        json.dump(out, open(os.environ["OUT"], "w"))
    if os.environ.get("KERNELS"):
        for fn, dims, _ in out:
            print(fn[:160], dims)
    print(f"{len(out)} launches recorded ({sum(1 for o in out if o[0].startswith('cupy:'))} of them CuPy operations)")
elif mode == "count":
    counts = collections.Counter()
    def wrapname(name, ns=fakecp, label=None):
        f = getattr(ns, name) if name in ns.__dict__ else ns.__getattr__(name)
        def g(*a, **k):
            fr = sys._getframe(1)
            key = (label or name, fr.f_code.co_filename.replace(tree + "/", "") + ":" + str(fr.f_lineno) + " " + fr.f_code.co_name)
            counts[key] += 1
            return f(*a, **k)
        setattr(ns, name, g)
    for n in ("empty", "ascontiguousarray", "zeros", "empty_like", "asarray"):
        wrapname(n)
    if hasattr(fakecp.cuda, "alloc"):       # a strided array made in one step (round 22b): its pool block
        wrapname("alloc", fakecp.cuda, "cuda.alloc")
    nl = [0]
    L._go = lambda *a: nl.__setitem__(0, nl[0] + 1)
    step()
    counts.clear(); nl[0] = 0
    cupy_log[0] = True
    step()
    cupy_log[0] = False
    tot = collections.Counter()
    for (n, c), v in counts.items(): tot[n] += v
    ops = collections.Counter()
    for (n, c), v in cupy_ops.items(): ops[n] += v
    print(f"{model} AMP={amp or 'off'} CL={int(cl)}: launches {nl[0]} kernels + {sum(ops.values())} CuPy operations"
          f" = {nl[0] + sum(ops.values())}", dict(tot))
    print("CuPy operations:", dict(ops))
    for (n, c), v in cupy_ops.most_common(25): print(f"{v:5d} {n:18s} {c}")
    for (n, c), v in counts.most_common(40): print(f"{v:5d} {n:18s} {c}")
elif mode == "copies":
    # the engine's leaf-gradient copies into the optimizer's flat buffer and its sums of two gradients, one step
    # (gradient destinations remove both where the producing kernels can write in place: minidnn/_grad_dest.py)
    import minidnn.autograd as A
    n = collections.Counter()
    def _counting(name):
        real = getattr(A, name)
        def f(*a, **k):
            n[name] += 1
            return real(*a, **k)
        setattr(A, name, f)
    _counting("_copy_into"); _counting("_add_grads")
    step()
    n.clear()
    step()
    print(f"{model} b{batch} AMP={amp or 'off'} CL={int(cl)}: leaf copies {n['_copy_into']}, gradient sums "
          f"{n['_add_grads']}")
elif mode == "time":
    import gc
    for _ in range(10): step()
    best = 1e9
    for r in range(7):
        gc.collect()
        t0 = time.process_time()
        for _ in range(20): step()
        best = min(best, (time.process_time() - t0) / 20)
    print(f"{model} b{batch} AMP={amp or 'off'} CL={int(cl)}: {best*1e3:.3f} ms/step (CPU time, fake CuPy)")
elif mode == "gc":
    import gc
    for _ in range(10): step()
    t_gc = collections.Counter(); n_gc = collections.Counter(); t_in = [0.0]
    def _cb(phase, info):
        if phase == "start": t_in[0] = time.perf_counter()
        else: t_gc[info["generation"]] += time.perf_counter() - t_in[0]; n_gc[info["generation"]] += 1
    gc.callbacks.append(_cb); steps = 200
    allocs0 = sys.getallocatedblocks()
    for _ in range(steps): step()
    gc.callbacks.remove(_cb)
    print(f"{model} b{batch}: per step over {steps} steps: " + ", ".join(
          f"gen{g} {n_gc[g] / steps:.3f} collections, {t_gc[g] / steps * 1e6:.1f} us" for g in range(3)),
          f"; gc.get_count() {gc.get_count()}, live objects {len(gc.get_objects())}")
elif mode == "cycles":
    # what the step leaves to the cyclic collector: objects found unreachable after 10 steps with it off, by type
    import gc
    for _ in range(10): step()
    gc.collect(); gc.disable(); gc.set_debug(gc.DEBUG_SAVEALL)
    for _ in range(10): step()
    n = gc.collect(); kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
    gc.set_debug(0); gc.garbage.clear(); gc.enable()
    print(f"{model} b{batch}: {n / 10:.0f} unreachable objects a step;", ", ".join(f"{k} {v / 10:g}" for k, v in kinds.most_common(25)))
elif mode == "amp_ab":
    import gc

    from minidnn import _amp_state
    caster = _amp_state._flat_caster
    best = {"flat cast on": 1e9, "flat cast off": 1e9}
    for _ in range(10): step()
    for r in range(15):
        for name, c in (("flat cast on", caster), ("flat cast off", None)):
            _amp_state.set_flat_caster(c)
            step(); step()
            gc.collect()
            t0 = time.process_time()
            for _ in range(20): step()
            best[name] = min(best[name], (time.process_time() - t0) / 20)
    _amp_state.set_flat_caster(caster)
    print(f"{model} b{batch} AMP={amp or 'off'} CL={int(cl)}: " + ", ".join(f"{k} {v*1e3:.3f}" for k, v in best.items())
          + " ms/step (CPU time, fake CuPy)")
elif mode == "sw_ab":
    # switches off vs on in one process (SW=module:NAME,... : each a one-element list flipped to False / True),
    # alternated rounds of 20 steps, min of ROUNDS (default 15): the load of the shared cores cancels
    import gc
    import importlib
    sws = []
    for item in os.environ["SW"].split(","):
        mod, name = item.split(":")
        sws.append(getattr(importlib.import_module(mod), name))
    saved = [s_[0] for s_ in sws]
    best = {"off": 1e9, "on": 1e9}
    for _ in range(5):
        for on in (False, True):
            for s_ in sws: s_[0] = on
            step()
    for r in range(int(os.environ.get("ROUNDS", "15"))):
        for name, on in (("off", False), ("on", True)):
            for s_ in sws: s_[0] = on
            step(); step()
            gc.collect()
            t0 = time.process_time()
            for _ in range(20): step()
            best[name] = min(best[name], (time.process_time() - t0) / 20)
    for s_, v in zip(sws, saved): s_[0] = v
    print(f"{model} b{batch} AMP={amp or 'off'} CL={int(cl)} SW={os.environ['SW']}: off {best['off']*1e3:.3f}, on "
          f"{best['on']*1e3:.3f} ms/step, on - off {(best['on'] - best['off'])*1e3:+.3f} ({(best['on'] / best['off'] - 1)*100:+.1f}%)"
          " (CPU time, fake CuPy)")
elif mode == "amp_vs_fp32":
    import gc
    best = {"fp32": 1e9, amp or "amp": 1e9}
    def step_as(on):
        global amp_dtype
        saved = amp_dtype
        amp_dtype = saved if on else None
        try: step()
        finally: amp_dtype = saved
    for _ in range(10): step_as(True); step_as(False)
    for r in range(15):
        for name, on in (("fp32", False), (amp or "amp", True)):
            step_as(on); step_as(on)
            gc.collect()
            t0 = time.process_time()
            for _ in range(20): step_as(on)
            best[name] = min(best[name], (time.process_time() - t0) / 20)
    print(f"{model} b{batch} CL={int(cl)}: " + ", ".join(f"{k} {v*1e3:.3f}" for k, v in best.items())
          + f" ms/step, difference {(best[amp or 'amp'] - best['fp32'])*1e3:.3f} (CPU time, fake CuPy)")
elif mode in ("cl_ab", "layers"):
    # the same model laid out NCHW and channels_last in one process (same seed, own optimizers), stepped alternately:
    # process-to-process noise cancels.  cl_ab: ms per step of each, min of 15 alternated rounds of 20 steps.
    # layers: µs a step per leaf module class (forward, the module's own call), per backward node (FunctionCtx
    # name), leaf accumulation, cross-entropy, zero_grad / step and the engine's own rest; each its min over 7 rounds
    # of 20
    import gc

    import minidnn.autograd as A
    mdn.manual_seed(0)
    m2 = eval(ctor[0], vars(M)).to("cuda")
    if not cl:
        m2.to(memory_format=mdn.channels_last)
    x2 = x.to(memory_format=mdn.contiguous_format if cl else mdn.channels_last)
    cfgs = {int(cl): (m, x, opt), int(not cl): (m2, x2, mdn.optim.SGD(m2.parameters(), lr=0.01, momentum=0.9))}
    names = {0: "NCHW", 1: "channels_last"}
    pair_amp = os.environ.get("PAIR", "") == "amp"      # PAIR=amp AMP=bf16: the pair is the step without / with
    if pair_amp:                                        # autocast (one model, one optimizer, CL as set)
        if amp_dtype is None:
            sys.exit("PAIR=amp needs AMP=bf16 or fp16")
        cfgs = {0: (m, x, opt, None), 1: (m, x, opt, amp_dtype)}
        names = {0: "fp32", 1: amp}
    def use(c):
        global m, x, opt, amp_dtype
        m, x, opt = cfgs[c][:3]
        if pair_amp:
            amp_dtype = cfgs[c][3]
    acc = collections.defaultdict(float); ncalls = collections.Counter()
    if mode == "layers":
        pc = time.perf_counter
        def timed(key, f):
            def g(*a, **k):
                t0 = pc()
                try: return f(*a, **k)
                finally: acc[key] += pc() - t0; ncalls[key] += 1
            return g
        for mod in (list(m.modules()) + ([] if pair_amp else list(m2.modules()))):
            if not any(True for _ in mod.children()) and "forward" not in mod.__dict__:
                mod.forward = timed("fwd " + type(mod).__name__, mod.forward)
        real_bw = A.FunctionCtx.backward
        def node_bw(self, *g):
            t0 = pc()
            try: return real_bw(self, *g)
            finally: k = "bwd " + self.name(); acc[k] += pc() - t0; ncalls[k] += 1
        A.FunctionCtx.backward = node_bw
        A.AccumulateGrad.accumulate = timed("bwd AccumulateGrad", A.AccumulateGrad.accumulate)
        A._add_grads = timed("bwd engine gradient sums", A._add_grads)
        A._run_backward = timed("backward (whole)", A._run_backward)
        F.cross_entropy = timed("fwd cross_entropy", F.cross_entropy)
        for c in ((0,) if pair_amp else (0, 1)):
            o = cfgs[c][2]
            o.step = timed("opt.step", o.step); o.zero_grad = timed("opt.zero_grad", o.zero_grad)
        mdn.Tensor.__add__ = timed("fwd Tensor.__add__", mdn.Tensor.__add__)
        import importlib
        for spec in filter(None, os.environ.get("WRAP", "").split(",")):   # more to time: module:Class.attr or
            mod_name, _, attr = spec.partition(":")                           # module:function (callers that
            owner = importlib.import_module(mod_name)                         # imported it by name keep theirs)
            *path, last = attr.split(".")
            for part in path: owner = getattr(owner, part)
            setattr(owner, last, timed("  " + spec.rsplit(".", 1)[-1].rsplit(":", 1)[-1], getattr(owner, last)))
    best = {0: 1e9, 1: 1e9}; per = {0: {}, 1: {}}
    for c in (0, 1):
        use(c)
        for _ in range(10): step()
    for r in range(15 if mode == "cl_ab" else 7):
        for c in (0, 1):
            use(c); step(); step()
            gc.collect(); acc.clear(); ncalls.clear()
            if mode == "layers": gc.disable()      # a collection lands in whichever part allocates: not attributed
            t0 = time.process_time()
            for _ in range(20): step()
            t = (time.process_time() - t0) / 20
            gc.enable()
            best[c] = min(best[c], t)
            for k, v in acc.items():        # each part's own minimum over the rounds (a stray ms lands anywhere)
                if k not in per[c] or v / 20 < per[c][k][0]:
                    per[c][k] = (v / 20, ncalls[k] / 20)
    print(f"{model} b{batch} AMP={amp or 'off'}: " + ", ".join(f"{names[c]} {best[c]*1e3:.3f}" for c in (0, 1))
          + f" ms/step, {names[1]} - {names[0]} {(best[1] - best[0])*1e3:+.3f} (CPU time, fake CuPy)")
    if mode == "layers":
        inner = sum(v[0] for k, v in per[1].items() if k.startswith("bwd "))
        for c in (0, 1):
            b = per[c].get("backward (whole)", (0, 0))[0]
            # the engine's own time: the whole backward less the nodes' (fused nodes call no nested FunctionCtx)
            per[c]["bwd engine (rest)"] = (b - sum(v[0] for k, v in per[c].items() if k.startswith("bwd ")
                                                   and k != "bwd engine gradient sums"), 1)
        print(f"{'us a step (calls)':44s} {names[0]:>16s} {names[1]:>16s} {'diff':>8s}")
        for k in sorted(set(per[0]) | set(per[1])):
            a, b = per[0].get(k, (0, 0)), per[1].get(k, (0, 0))
            print(f"{k:44s} {a[0]*1e6:9.1f} ({a[1]:4.0f}) {b[0]*1e6:9.1f} ({b[1]:4.0f}) {(b[0]-a[0])*1e6:+8.1f}")
        del inner
elif mode == "prof":
    import cProfile
    import gc
    import pstats
    for _ in range(5): step()
    if os.environ.get("NOGC", "") not in ("", "0"): gc.disable()   # NOGC=1: collections not charged to whoever allocates
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): step()
    pr.disable()
    if os.environ.get("PROF_OUT"): pr.dump_stats(os.environ["PROF_OUT"])
    pstats.Stats(pr).sort_stats(os.environ.get("SORT","tottime")).print_stats(int(os.environ.get("N","40")))
elif mode == "trace":
    # one step's Python calls as an indented tree (C calls too with CCALLS=1), minidnn's frames and what they call:
    # the frames each op walks (host round 31); TRACE_OUT=file writes it there
    for _ in range(5): step()
    lines = []; depth = [0]; cc = os.environ.get("CCALLS", "") not in ("", "0")
    def _tr(frame, event, arg):
        if event == "call":
            co = frame.f_code
            lines.append("  " * depth[0] + f"{co.co_name}  {co.co_filename.replace(tree + '/', '')}:{frame.f_lineno}")
            depth[0] += 1
        elif event == "return":
            depth[0] -= 1
        elif cc and event == "c_call":
            lines.append("  " * depth[0] + f"[C] {getattr(arg, '__qualname__', arg)}")
    sys.setprofile(_tr); step(); sys.setprofile(None)
    text = "\n".join(lines)
    if os.environ.get("TRACE_OUT"): open(os.environ["TRACE_OUT"], "w").write(text + "\n")
    else: print(text)
    print(f"{sum(1 for ln in lines if not ln.lstrip().startswith('[C]'))} Python calls in one step")
elif mode == "opcodes":
    # Python opcodes a step by function (self; sys.settrace opcode events, one step after five): where the
    # interpreter's work goes, C calls not included (host round 31); N rows
    for _ in range(5): step()
    ops = collections.Counter(); calls = collections.Counter()
    def _op(frame, event, arg):
        co = frame.f_code
        key = f"{co.co_filename.replace(tree + '/', '')}:{co.co_firstlineno} {co.co_name}"
        if event == "call":
            frame.f_trace_opcodes = True; calls[key] += 1
        elif event == "opcode":
            ops[key] += 1
        return _op
    sys.settrace(_op); step(); sys.settrace(None)
    print(f"{sum(ops.values())} opcodes, {sum(calls.values())} Python calls in one step")
    for k, v in ops.most_common(int(os.environ.get("N", "50"))): print(f"{v:7d} {calls[k]:5d}  {k}")
elif mode == "instr":
    # instructions a step, switches off / on (SW=module:NAME,...; none: the same setting twice), under callgrind:
    # this process runs itself again under valgrind (MODE=instr_child), which after warm-up steps takes, three times,
    # [flip, one unmeasured step, os.getpid() (a dump), 3 steps, os.getpid()]; each even dump is 3 steps of one
    # setting.  Reads the dumps' totals (host rounds 30-31: CPU time on the shared cores moved 2-3 ms between runs)
    import glob
    import subprocess
    import tempfile
    d = tempfile.mkdtemp(prefix="fake_instr_")
    env = dict(os.environ, MODE="instr_child")
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=getpid", "--dump-instr=no",
                    f"--callgrind-out-file={d}/cg.%p", sys.executable] + sys.argv, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def _ir(f):
        for ln in open(f):
            if ln.startswith("summary:") or ln.startswith("totals:"):
                return int(ln.split()[1])
    dumps = sorted(glob.glob(f"{d}/cg.*.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    irs = [_ir(f) for f in dumps]
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    meas = irs[1::2][:6]          # dumps 2, 4, ... 12 (1-based): the measured stretches
    off = [v / 3 for v in meas[0::2]]; on = [v / 3 for v in meas[1::2]]
    # (the first stretch measured runs ~0.6% more instructions whatever its setting: the ratio leaves it out)
    print(f"{model} b{batch} AMP={amp or 'off'} CL={int(cl)} SW={os.environ.get('SW', '')}: instructions a step off "
          + ", ".join(f"{v/1e6:.3f} M" for v in off) + "; on " + ", ".join(f"{v/1e6:.3f} M" for v in on)
          + f"; on / off {sum(on[1:]) / sum(off[1:]):.4f} (the first pair left out)")
elif mode == "instr_child":
    import importlib
    sws = []
    for item in filter(None, os.environ.get("SW", "").split(",")):
        mod, name = item.split(":")
        sws.append(getattr(importlib.import_module(mod), name))
    if os.environ.get("PAIR", "") == "amp":     # PAIR=amp AMP=bf16: "off" the step without autocast, "on" with it
        class _AmpSwitch(list):
            def __setitem__(self, i, on):
                global amp_dtype
                amp_dtype = _amp_low if on else None
        _amp_low = amp_dtype
        sws.append(_AmpSwitch([True]))
    for on in (False, True):
        for s_ in sws: s_[0] = on
        step(); step()
    for _ in range(3):
        for on in (False, True):
            for s_ in sws: s_[0] = on
            step(); os.getpid()
            for _ in range(3): step()
            os.getpid()
elif mode == "callers":
    import cProfile
    import pstats
    for _ in range(5): step()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): step()
    pr.disable()
    st = pstats.Stats(pr)
    for pat in os.environ.get("PAT", "__hash__|device_of|resolve_handle").split(","):
        st.print_callers(pat)
elif mode == "calls":
    import gc

    from minidnn import autograd as AG
    from minidnn.backend import handle as H
    from minidnn.backend.algorithm_selection import Determinism
    from minidnn.backend.handle import MathType
    ts = [mdn.Tensor._from_array(fakecp.empty((4,))) for _ in range(5)]
    arr = ts[0].data
    key = ("conv", (2, 3), MathType.DEFAULT, Determinism.DETERMINISTIC, MathType.TENSOR_OP)
    d = {key: 1}
    ops = {"_check_same_device 5 GPU tensors": lambda: AG._check_same_device("x", ts),
           "configured_default_handle(gpu array)": lambda: H.configured_default_handle(arr),
           "dict.get of a key with 3 enums": lambda: d.get(key)}
    for name, f in ops.items():
        for _ in range(1000): f()
        r = 1e9
        for _ in range(7):
            t0 = time.process_time()
            for _ in range(20000): f()
            r = min(r, (time.process_time() - t0) / 20000)
        print(f"{name:40s} {r*1e6:6.3f} us")

"""A/B of session 9's kernel-table switches on the GPU: each touched row of bench/kernels_gpu.py timed with its switch
on and off, device time only (CUDA-graph replays, as the bench's graph columns), from one process.

    python tools/ktable_ab.py [--rows logsoftmax,biasgrad,dropout] [--dtypes float32,bfloat16] [--rounds 6]
                              [--trials 5]

Rows (the bench's own cases, shapes and compulsory bytes; --sizes large):
  logsoftmax  log-softmax bwd (16384, 1000)     softmax_kernels.BWD_PIPE    (MINIDNN_SOFTMAX_BWD_PIPE)
  biasgrad    bias grad (linear) (16384, 1024)  norm_kernels.COLSUM_VEC     (MINIDNN_COLSUM_VEC)
  dropout     dropout fwd (p=0.5) (128,64,56,56) dropout_philox.PIPE_FWD    (MINIDNN_DROPOUT_PIPE: "1" vs "0")
  cefwd       cross-entropy fwd (16384, 1000)   loss_kernels.CE_FAST        (MINIDNN_CE_FAST: "1" vs "0")
  cebwd       cross-entropy bwd (16384, 1000)   loss_kernels.CE_FAST        (MINIDNN_CE_FAST: "1" vs "0")
  gnvcs       group norm G=32 bwd (128,64,56,56) norm_kernels.GN_VSUMS     (MINIDNN_GN_VSUMS; default on)
  dropbwd8    dropout bwd (128,64,56,56): on = TILE_BWD 8 (8 elements a thread: PyTorch's masked-scale kernel's
              work a thread), off = the default (4, streaming hints)
  dropbwdh0   dropout bwd: on = plain loads and stores (HINT_BWD 0), off = streaming (1)
  smxnopipe   softmax fwd (16384, 1000): on = FWD_PIPE off (the session-6 grid: four blocks an SM, a row a warp,
              no prefetch; PyTorch's persistent-warp softmax is of that kind), off = the PIPE default
  lsmxnopipe  log-softmax fwd, the same switch
  relu128     relu fwd (128,64,56,56): act_kernels CONFIG on = PyTorch's launch shape, 128-thread blocks, 2 vectors
              a thread for 4-byte data (16-bit: 1, as now), off = the default (256 threads, 4 vectors)
  relu128b    relu bwd, the same switch (it changes both directions: keep it only if bwd does not lose)
  relu2       relu fwd: on = 256-thread blocks of 2 vectors a thread (4-byte data)
  logsoftmax64  log-softmax bwd: on = the 64-thread-block tiling softmax's backward uses (MINIDNN_SOFTMAX_BWD_WARP=0,
              no pipe), off = the default (warp rows, piped): off/on > 1 means the block tiling is the better fix
  cefwd16a    cross-entropy fwd (16384, 1000), session 10: on = loss_kernels.CE_FWD16 "1" (P16: the 16-bit pipe
              forward on packed words, one row ahead, 64 registers: four blocks an SM; the default since session 10),
              off = "0" (session 9's FASTX pipe); 2-byte logits only (the float32 line times one kernel twice)
(Session 10's candidates not adopted after the H100 and H200 A/Bs were removed in session 11 with their rows:
lnbwd (layer norm route "v2w"), cefwd16b (CE_FWD16 "2"), smxd2 / lsmxd2 (FWD_PDEPTH 2), smxsp3 / lsmxsp3 / smxsp2 /
lsmxsp2 (FWD_SPIPE); docs/step_kernels.md.  Session 9's gnbwd (norm_kernels.GN_PREFETCH, measured slower in run 6)
went with its switch in session 19.)
Method: per row, `rounds` rounds; a round times the switch ON then OFF, the next OFF then ON (both orders, so a
drift of clocks or temperature cancels), each timing a fresh capture of the bench's `reps` calls replayed `trials`
times (median).  Flipping a switch forgets the module's settled launches (and the primitive's seen-call caches)
first, so the next capture plans and compiles anew; the line `plan` shows what each setting launched.  Reported:
the median over rounds of each setting (ms a call, GB/s, % of the copy bandwidth measured in the same run), the
median of the per-round ratios off/on (> 1: the switch helps), the spread of the rounds (max/min - 1), and
PyTorch's graphed time of the same op.  Keep the switch where off/on > 1 beyond the spread.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)


def _forget_softmax():
    from minidnn.backend import softmax as _smx
    from minidnn.backend.cuda import loss_kernels as _lk
    from minidnn.backend.cuda import softmax_kernels as _sk
    _sk._plans.clear()
    _lk._plans.clear()
    for k, v in vars(_smx).items():
        if isinstance(v, dict) and "seen" in k.lower():      # SeenCalls tables: they hold the kernels' plans
            v.clear()


def _softmax_switch(on):
    from minidnn.backend.cuda import softmax_kernels as _sk
    _sk.BWD_PIPE = on
    _forget_softmax()


def _softmax64_switch(on):
    from minidnn.backend.cuda import softmax_kernels as _sk
    _sk._BWD_WARP_ENV = "0" if on else ""
    _sk.BWD_PIPE = not on
    _forget_softmax()


def _softmax_plan(dtype):
    from minidnn.backend.cuda import softmax_kernels as _sk
    s = _sk.launch_spec(True, (16384, 1000), (1,), "LOG", dtype)
    d = dict(x.split("=", 1) for x in s.defines)
    return f"{s.name} PIPE={d['PIPE']} G={d['G']} MINB={d['MINB']} blocks/SM={s.per_sm}"


def _bias_switch(on):
    from minidnn.backend.cuda import norm_kernels as NK
    NK.COLSUM_VEC = on
    NK._plans.clear()


def _bias_plan(dtype):
    from minidnn.backend.cuda import norm_kernels as NK
    if not NK.COLSUM_VEC:
        return "col_sum (one 4-byte load a thread)"
    vec, tiles, splits, chunk = NK.col_sum_v_geometry(16384, 1024, dtype.itemsize, _launch_sms())
    return f"col_sum_v VEC={vec} grid=({tiles}, {splits}) rows/split={chunk}"


_DROP_DEFAULT = []          # dropout_philox's (TILE_BWD, HINT_BWD) as imported, taken at the first switch


def _dropout_switch(on):
    from minidnn.backend.cuda import dropout_philox as DP
    DP.PIPE_FWD = "1" if on else "0"
    DP.clear_plans()


def _dropout_plan(dtype):
    from minidnn.backend.cuda import dropout_philox as DP
    n = 128 * 64 * 56 * 56
    if DP.uses_pipe(dtype, n):
        return (f"dropout_fwd_pipe PUNROLL={DP.pipe_unroll(dtype.itemsize)} blocks="
                f"{DP.pipe_grid(n, dtype.itemsize, _launch_sms())}")
    return f"dropout_fwd UNROLL={DP.forward_unroll(n, dtype.itemsize, 0)}"


def _gn_plan(dtype):
    from minidnn.backend.cuda import norm_kernels as NK
    team, vpt, vec = NK.row_config2(2 * 56 * 56, dtype, True, "gn_bwd")
    block, minb = NK._v2_launch_shape("gn_bwd", team, dtype.itemsize)
    if NK._version("gn_bwd", dtype) == "v2m4" and block == 256 and dtype.itemsize == 2:
        minb = 4
    return f"gn_bwd2 team={team} VPT={vpt} GN_VCS={int(NK.GN_VSUMS)} minb={minb}"


def _ce_switch(on):
    from minidnn.backend.cuda import loss_kernels as _lk
    _lk.CE_FAST = "1" if on else "0"
    _forget_softmax()


def _ce_plan(name):
    def plan(dtype):
        from minidnn.backend.cuda import loss_kernels as _lk
        src, k, defines, groups, per_sm, block = _lk.launch_spec(name, (16384, 1000), dtype, "int64", False, "mean")
        d = dict(x.split("=", 1) for x in defines)
        return f"{k} FASTX={d['FASTX']} PIPE={d['PIPE']} MINB={d['MINB']} blocks/SM={per_sm}"
    return plan


def _ce16_switch(setting):
    """loss_kernels.CE_FWD16: ``setting`` on, "0" (the default) off."""
    def switch(on):
        from minidnn.backend.cuda import loss_kernels as _lk
        _lk.CE_FWD16 = setting if on else "0"
        _forget_softmax()
    return switch


def _ce16_plan(dtype):
    from minidnn.backend.cuda import loss_kernels as _lk
    src, k, defines, groups, per_sm, block = _lk.launch_spec("ce_fwd", (16384, 1000), dtype, "int64", False, "mean")
    d = dict(x.split("=", 1) for x in defines)
    return f"{k} FASTX={d['FASTX']} PIPE={d['PIPE']} P16={d.get('P16', 0)} MINB={d['MINB']} blocks/SM={per_sm}"


def _gnvcs_switch(on):
    from minidnn.backend.cuda import norm_kernels as NK
    NK.GN_VSUMS = on
    NK._plans.clear()


def _dropbwd_switch(setting):
    """dropout backward's launch: ``setting`` (TILE_BWD, HINT_BWD) on, the module's values at import off."""
    def switch(on):
        from minidnn.backend.cuda import dropout_philox as DP
        if not _DROP_DEFAULT:
            _DROP_DEFAULT.extend((DP.TILE_BWD, DP.HINT_BWD))
        DP.TILE_BWD, DP.HINT_BWD = setting if on else tuple(_DROP_DEFAULT)
        DP.clear_plans()
    return switch


def _dropbwd_plan(dtype):
    from minidnn.backend.cuda import dropout_philox as DP
    n = 128 * 64 * 56 * 56
    return f"dropout_bwd_tile TILE={DP.backward_tile(n, dtype.itemsize, 0)} HINT={DP.HINT_BWD}"


def _smx_fwd_switch(on):
    """on: the session-6 forward (no PIPE: a grid of one row a group, four blocks an SM); off: the PIPE default."""
    _sk_mod().FWD_PIPE = not on
    _forget_softmax()


def _sk_mod():
    from minidnn.backend.cuda import softmax_kernels as _sk
    return _sk


def _smx_fwd_plan(algo):
    def plan(dtype):
        s = _sk_mod().launch_spec(False, (16384, 1000), (1,), algo, dtype)
        d = dict(x.split("=", 1) for x in s.defines)
        return (f"{s.name} PIPE={d['PIPE']} G={d['G']} MINB={d['MINB']} blocks/SM={s.per_sm} "
                f"smem={s.smem // 1024} KB")
    return plan


_ACT_DEFAULT = {}


def _act_switch_to(cand):
    """ReLU's launch shape: ``cand`` (unroll for 4-byte data, threads) on, the module's defaults off."""
    def switch(on):
        from minidnn.backend import activation as _act
        from minidnn.backend.cuda import act_kernels as AK
        if not _ACT_DEFAULT:
            _ACT_DEFAULT.update({k: dict(v) for k, v in (("4", AK.CONFIG), ("2", AK.CONFIG16))})
        for key, cfg in (("4", AK.CONFIG), ("2", AK.CONFIG16)):
            cfg.update(_ACT_DEFAULT[key])
            if on:
                cfg.update(threads=cand[1], unroll=cand[0] if key == "4" else cfg["unroll"])
        _act._SEEN.clear()
        AK._plans.clear()
    return switch


def _act_plan(dtype):
    from minidnn.backend.cuda import act_kernels as AK
    cfg = AK.config(dtype)
    nv = 128 * 64 * 56 * 56 * dtype.itemsize // 16
    return (f"act unroll={cfg['unroll']} threads={cfg.get('threads', 256)} blocks="
            f"{AK._vec_grid(nv, 0, cfg)[0]}")


def _launch_sms():
    from minidnn.backend.cuda import launch
    return launch.sm_count(0)


# row key: (bench kind, bench row name, switch(on), plan(dtype), the switch's default)
ROWS = {
    "logsoftmax": ("softmax", "log-softmax bwd", _softmax_switch, _softmax_plan, True),
    "logsoftmax64": ("softmax", "log-softmax bwd", _softmax64_switch, _softmax_plan, None),
    "biasgrad": ("bias", "bias grad (linear)", _bias_switch, _bias_plan, True),
    "dropout": ("dropout", "dropout fwd (p=0.5)", _dropout_switch, _dropout_plan, None),
    "cefwd": ("ce", "cross-entropy fwd", _ce_switch, _ce_plan("ce_fwd"), None),
    "cebwd": ("ce", "cross-entropy bwd", _ce_switch, _ce_plan("ce_bwd"), None),
    "gnvcs": ("gn", "group norm G=32 bwd", _gnvcs_switch, _gn_plan, True),
    "dropbwd8": ("dropout", "dropout bwd", _dropbwd_switch((8, 1)), _dropbwd_plan, None),
    "dropbwdh0": ("dropout", "dropout bwd", _dropbwd_switch((4, 0)), _dropbwd_plan, None),
    "smxnopipe": ("softmax", "softmax fwd", _smx_fwd_switch, _smx_fwd_plan("ACCURATE"), None),
    "lsmxnopipe": ("softmax", "log-softmax fwd", _smx_fwd_switch, _smx_fwd_plan("LOG"), None),
    "relu128": ("relu", "relu fwd", _act_switch_to((2, 128)), _act_plan, None),
    "relu128b": ("relu", "relu bwd", _act_switch_to((2, 128)), _act_plan, None),
    "relu2": ("relu", "relu fwd", _act_switch_to((2, 256)), _act_plan, None),
    "cefwd16a": ("ce", "cross-entropy fwd", _ce16_switch("1"), _ce16_plan, None),
}


def _default_restore(key):
    """Put the switch back as the environment set it (dropout: the per-dtype default "16")."""
    if key == "dropout":
        from minidnn.backend.cuda import dropout_philox as DP
        DP.PIPE_FWD = os.environ.get("MINIDNN_DROPOUT_PIPE", "16")
        DP.clear_plans()
    elif key.startswith("dropbwd"):
        _dropbwd_switch(None)(False)
    elif key == "cefwd16a":
        from minidnn.backend.cuda import loss_kernels as _lk
        _lk.CE_FWD16 = os.environ.get("MINIDNN_CE_FWD16", "1")          # the module's default since session 10
        _forget_softmax()
    elif key in ("smxnopipe", "lsmxnopipe"):
        _sk_mod().FWD_PIPE = os.environ.get("MINIDNN_SOFTMAX_PIPE", "1") != "0"
        _forget_softmax()
    elif key == "gnvcs":
        _gnvcs_switch(os.environ.get("MINIDNN_GN_VSUMS", "1") != "0")
    elif key.startswith("relu"):
        _act_switch_to(None)(False)
    elif key in ("cefwd", "cebwd"):
        from minidnn.backend.cuda import loss_kernels as _lk
        _lk.CE_FAST = os.environ.get("MINIDNN_CE_FAST", "16")
        _forget_softmax()
    elif key in ("logsoftmax", "logsoftmax64"):
        from minidnn.backend.cuda import softmax_kernels as _sk
        _sk._BWD_WARP_ENV = os.environ.get("MINIDNN_SOFTMAX_BWD_WARP", "")
        _softmax_switch(os.environ.get("MINIDNN_SOFTMAX_BWD_PIPE", "1") != "0")
    else:
        _bias_switch(os.environ.get("MINIDNN_COLSUM_VEC", "1") != "0")


def run_row(timer, cases, key, dtype_name, bw, rounds):
    kind, row_name, switch, plan, _ = ROWS[key]
    rows = [r for r in KG.build(cases, kind, "large") if r[0] == row_name]
    if not rows:
        print(f"{key}: no row named {row_name!r} in bench/kernels_gpu.py")
        return
    name, shape, (fn, tfn, nbytes), _ = rows[0]
    reps = None
    got = {True: [], False: []}
    ratios = []
    plans = {}
    try:
        for r in range(rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            this = {}
            for on in order:
                switch(on)
                plans[on] = plan(cases.dt)
                fn()                                    # plans and compiles outside the capture
                reps = reps or timer.reps(fn, "minidnn")
                this[on] = timer.graph(fn, reps, "minidnn")
                got[on].append(this[on])
            ratios.append(this[False] / this[True])
    finally:
        _default_restore(key)
    tms = None
    if tfn is not None:
        try:
            tms = timer.graph(tfn, timer.reps(tfn, "torch"), "torch")
        except Exception as exc:        # noqa: BLE001
            print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
    for on in (True, False):
        ms = statistics.median(got[on])
        gbs = nbytes / (ms * 1e-3) / 1e9
        spread = max(got[on]) / min(got[on]) - 1
        vs = f"  vs torch {tms / ms:5.2f}x" if tms else ""
        print(f"{name:22s} {dtype_name:9s} {'on ' if on else 'off'}  {ms:8.4f} ms  {gbs:6.0f} GB/s  "
              f"{100 * gbs / bw:4.0f}%  spread {100 * spread:4.1f}%{vs}   plan: {plans[on]}")
    print(f"{'':22s} {dtype_name:9s} off/on {statistics.median(ratios):.3f} (rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)})" + (f"; torch graph {tms:.4f} ms" if tms else ""))
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    start = KG.ab_start("ktable_ab", args.trials, args.rounds, "on / off, alternating order", benchmark=True)
    if start is None:
        return 0
    cp, torch, timer, bw = start
    with KG.torch_stream(torch):           # PyTorch's ops on one stream, so its backwards can be captured
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for key in args.rows.split(","):
                try:
                    run_row(timer, cases, key, dtype_name, bw, args.rounds)
                except Exception as exc:        # noqa: BLE001 -- one row must not take the others down
                    print(f"{key} {dtype_name}: failed: {type(exc).__name__}: {exc}")
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data parallel training on the CPU backend with real processes: three ranks started by the launcher run every
scenario of _worker.py once (one launch for the whole file keeps it fast); each test compares what the ranks
recorded with a single-process reference computed here (float64: N ranks x batch B == one process x batch N*B)."""
import json
import os
import subprocess
import sys

import _scenarios as S
import numpy as np
import pytest

import minidnn as mdn
from minidnn.nn import functional as F

WORLD = 3
HERE = os.path.dirname(os.path.abspath(__file__))
TIGHT = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    proc = subprocess.run([sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node", str(WORLD),
                           os.path.join(HERE, "_worker.py"), str(out)], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(HERE)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = []
    for r in range(WORLD):
        with open(out / f"rank{r}.json") as f:
            plain = json.load(f)
        arrays = dict(np.load(out / f"rank{r}.npz"))
        errors = {k: v for k, v in plain.items() if k.endswith(".error")}
        result.append((plain, arrays, errors))
    return result


def lst(arrays, plain, key):
    return [arrays[f"{key}.{i}"] for i in range(plain[key + ".len"])]


def no_errors(ranks, name):
    for plain, _, errors in ranks:
        assert name + ".error" not in errors, errors[name + ".error"]


def test_launcher_environment(ranks):
    ports = set()
    for r, (plain, _, _) in enumerate(ranks):
        env = plain["env"]
        assert env["RANK"] == str(r) and env["LOCAL_RANK"] == str(r) and env["WORLD_SIZE"] == str(WORLD)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        ports.add(env["MASTER_PORT"])
        assert plain["rank"] == r and plain["world"] == WORLD
    assert len(ports) == 1


def test_collectives(ranks):
    no_errors(ranks, "collectives")
    base = [np.array([1.5, -2.0, 3.0]) * (r + 1) + r for r in range(WORLD)]
    ints = [np.array([3, 5, 12], dtype=np.int64) << r for r in range(WORLD)]
    expect = {"SUM": base[0] + base[1] + base[2], "AVG": (base[0] + base[1] + base[2]) / WORLD,
              "PRODUCT": base[0] * base[1] * base[2], "MIN": np.minimum.reduce(base), "MAX": np.maximum.reduce(base)}
    int_expect = {"BAND": np.bitwise_and.reduce(ints), "BOR": np.bitwise_or.reduce(ints),
                  "BXOR": np.bitwise_xor.reduce(ints), "SUM": np.sum(ints, axis=0)}
    for r, (plain, arrays, _) in enumerate(ranks):
        for op, want in expect.items():
            np.testing.assert_allclose(arrays[f"all_reduce_{op}"], want, rtol=1e-15, err_msg=op)
        for op, want in int_expect.items():
            np.testing.assert_array_equal(arrays[f"all_reduce_int_{op}"], want, err_msg=op)
        assert arrays["all_reduce_f32"].dtype == np.float32
        np.testing.assert_array_equal(arrays["all_reduce_f32"], np.full((2, 3), 0.5 + 1.5 + 2.5, np.float32))
        assert plain["work_wait"] is True
        for src in range(WORLD):
            np.testing.assert_array_equal(arrays[f"broadcast_{src}"], np.arange(4.0) + 10 * src)
        np.testing.assert_array_equal(arrays["all_gather"],
                                      np.stack([np.full((2, 2), float(q)) for q in range(WORLD)]))
        assert plain["all_gather_object"] == [{"rank": q, "name": f"r{q}"} for q in range(WORLD)]
        assert plain["broadcast_object_list"] == [f"from {WORLD - 1}", WORLD - 1]


def test_mismatched_collectives_fail_on_every_rank(ranks):
    no_errors(ranks, "mismatches")
    for plain, _, _ in ranks:
        assert "all_reduce with mismatched arguments" in plain["mismatch_shape"]
        assert "(3,)/float64" in plain["mismatch_shape"] and "(4,)/float64" in plain["mismatch_shape"]
        assert "(3,)/float32" in plain["mismatch_dtype"]
        assert "rank 0 called barrier, rank 1 called broadcast" in plain["mismatch_op"]


def single_process(kind, model_fn=S.mlp):
    xs, ys = S.data(WORLD)
    model = model_fn(seed=0)
    opt = S.make_optimizer(model.parameters(), kind)
    losses = S.train(model, opt, xs, ys)
    return model, losses


@pytest.mark.parametrize("kind", ["sgd_fused", "sgd_unfused", "adam"])
def test_ddp_equals_one_process_with_the_whole_batch(ranks, kind):
    """N ranks with batch B == one process with batch N*B after k steps (float64)."""
    no_errors(ranks, f"ddp_{kind}")
    ref, _ = single_process(kind)
    start = S.params_of(S.mlp(seed=0))
    for plain, arrays, _ in ranks:
        for a, b in zip(lst(arrays, plain, f"ddp_{kind}_start"), start):     # rank 0's initial parameters everywhere
            np.testing.assert_array_equal(a, b)
        for a, b in zip(lst(arrays, plain, f"ddp_{kind}_params"), S.params_of(ref)):
            np.testing.assert_allclose(a, b, **TIGHT)
    flat = kind != "sgd_unfused"
    layout = ranks[0][0][f"ddp_{kind}_layout"]
    assert all((b[0] == "flat") == flat for b in layout)
    if kind != "adam":
        assert len(layout) >= 3                 # small buckets: several all-reduces per backward


def test_flat_buckets_are_consecutive_ranges_launched_during_backward(ranks):
    plain = ranks[0][0]
    layout = plain["ddp_sgd_fused_layout"]
    stops = [int(b[1]) for b in layout[1:]]
    assert stops == [int(b[2]) for b in layout[:-1]] and int(layout[0][1]) == 0
    seen = plain["overlap_grads_at_reduce"]
    # the first bucket reduced (the last in flat order) starts before backward reached the first layers
    assert len(seen) == len(layout) and seen[0] < plain["overlap_params"] and seen == sorted(seen)
    assert plain["state_dict_keys"] == sorted(f"module.{n}" for n, _ in S.mlp(0).named_parameters())


def test_no_sync_accumulates_locally_then_averages(ranks):
    no_errors(ranks, "no_sync")
    xs, ys = S.data(WORLD, steps=2, seed=1)
    model = S.mlp(seed=0)
    opt = S.make_optimizer(model.parameters(), "sgd_fused")
    opt.zero_grad()
    for k in range(2):          # the mean loss of micro-batch k over all ranks, accumulated
        F.cross_entropy(model(mdn.tensor(xs[k])), mdn.tensor(ys[k])).backward()
    want_grad = [p.grad.numpy().copy() for p in model.parameters()]
    opt.step()
    locals_ = [lst(a, p, "no_sync_local_grad") for p, a, _ in ranks]
    assert not all(np.allclose(locals_[0][0], other[0]) for other in locals_[1:])   # no all-reduce inside no_sync
    for plain, arrays, _ in ranks:
        for a, b in zip(lst(arrays, plain, "no_sync_grad"), want_grad):
            np.testing.assert_allclose(a, b, **TIGHT)
        for a, b in zip(lst(arrays, plain, "no_sync_params"), S.params_of(model)):
            np.testing.assert_allclose(a, b, **TIGHT)


def test_sync_batchnorm_equals_batchnorm_on_the_whole_batch(ranks):
    no_errors(ranks, "sync_batchnorm")
    xs = np.random.default_rng(2).standard_normal((S.STEPS, WORLD * S.B, 2, 5, 5)) * 3 + 1
    ys = np.random.default_rng(3).integers(0, 3, (S.STEPS, WORLD * S.B))
    model = S.conv_bn(seed=0)
    logits0 = model(mdn.tensor(xs[0])).numpy()        # the ranks ran this forward too (running stats move)
    opt = S.make_optimizer(model.parameters(), "sgd_fused")
    S.train(model, opt, xs, ys)
    for r, (plain, arrays, _) in enumerate(ranks):
        assert plain["syncbn_types"][2] == "SyncBatchNorm"
        np.testing.assert_allclose(arrays["syncbn_logits0"], logits0[r * S.B:(r + 1) * S.B], **TIGHT)
        for a, b in zip(lst(arrays, plain, "syncbn_params"), S.params_of(model)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        for a, b in zip(lst(arrays, plain, "syncbn_buffers"), [b.numpy() for b in model.buffers()]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_find_unused_parameters(ranks):
    """Rank 0 skips branch b, the others use it; branch c is used by nobody and keeps grad None."""
    no_errors(ranks, "find_unused")
    xs, ys = S.data(WORLD, steps=2, seed=4)
    model = S.Branches(seed=0)
    opt = S.make_optimizer(model.parameters(), "sgd_fused")
    for k in range(2):
        opt.zero_grad()
        total = 0
        for r in range(WORLD):
            rows = slice(r * S.B, (r + 1) * S.B)
            total = total + F.cross_entropy(model(mdn.tensor(xs[k, rows]), use_b=(r != 0)), mdn.tensor(ys[k, rows]))
        (total / WORLD).backward()
        opt.step()
    for plain, arrays, _ in ranks:
        for a, b in zip(lst(arrays, plain, "unused_params"), S.params_of(model)):
            np.testing.assert_allclose(a, b, **TIGHT)
        assert plain["unused_c_grad_is_none"] == [True, True]


def test_unfinished_reduction_is_reported(ranks):
    for plain, _, _ in ranks:
        assert "expected to have finished reduction" in plain["unfinished"]
        assert "c.weight" in plain["unfinished"] and "find_unused_parameters=True" in plain["unfinished"]


def test_different_models_are_refused(ranks):
    for plain, _, _ in ranks:
        assert "module differs" in plain["different_models"] and "(3, 3)" in plain["different_models"]


def test_buffers_are_broadcast_at_construction(ranks):
    for _, arrays, _ in ranks:
        np.testing.assert_array_equal(arrays["buffer_after_wrap"], np.full(4, 1.0))


def test_sampler_shares_are_disjoint_and_cover_the_dataset(ranks):
    no_errors(ranks, "sampler")
    for drop_last, per_rank in ((False, 4), (True, 3)):
        shares = [plain[f"sampler_{drop_last}"] for plain, _, _ in ranks]
        for epoch in range(2):
            got = [s[epoch] for s in shares]
            assert all(len(g) == per_rank for g in got)
            merged = [i for g in got for i in g]
            if drop_last:           # 11 items, 3 ranks: 9 distinct items, 2 dropped
                assert len(set(merged)) == 9
            else:                   # padded to 12 by wrapping: every item at least once, one twice
                assert set(merged) == set(range(11)) and len(merged) == 12
        assert shares[0][0] != shares[0][1]        # set_epoch reshuffles
        assert all(plain[f"sampler_len_{drop_last}"] == per_rank for plain, _, _ in ranks)

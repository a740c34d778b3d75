"""tests/_nvcc.pick: the spread of kernel configurations the CPU suite compiles."""
import importlib

import pytest

from tests import _nvcc


def test_a_spread_with_both_ends_and_the_fixed_items():
    items = list(range(20))
    got = _nvcc.pick(items, 4, always=lambda i: i in (7, 8)) if not _nvcc.FULL else None
    if got is None:
        pytest.skip("MINIDNN_NVCC_ALL=1: every configuration is compiled")
    assert got == sorted(got) and {7, 8} <= set(got)
    rest = [i for i in got if i not in (7, 8)]
    assert len(rest) == 4 and rest[0] == 0 and rest[-1] == 19
    assert _nvcc.pick(items, 1, always=[3]) == [0, 3]
    assert _nvcc.pick(items[:3], 5) == [0, 1, 2]
    assert _nvcc.pick(["a", "b", "c"], 0, always=["b"]) == ["b"]


def test_everything_under_the_environment_switch(monkeypatch):
    monkeypatch.setenv("MINIDNN_NVCC_ALL", "1")
    m = importlib.reload(_nvcc)
    try:
        assert m.FULL and m.pick(list(range(30)), 2) == list(range(30))
    finally:
        monkeypatch.delenv("MINIDNN_NVCC_ALL")
        importlib.reload(_nvcc)
    assert not _nvcc.FULL or __import__("os").environ.get("MINIDNN_NVCC_ALL") == "1"


# ---- _nvcc.build: several units in one nvcc run -----------------------------------------------------------------

def _ptxas_lines(log):
    return [line for line in log.splitlines() if "Compile time" not in line]


_UNIT = r'''
#ifndef SCALE
#define SCALE 2
#endif
#define TWICE(v) ((v) * SCALE)
__device__ __noinline__ float helper(float v) { return TWICE(v) + 1.0f; }
extern "C" __global__ void __launch_bounds__(BLOCK) k_one(float* __restrict__ y, const float* __restrict__ x, int n)
{
    __shared__ float s[BLOCK];
    int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = i < n ? helper(x[i]) : 0.0f;
    __syncthreads();
    if (i < n) y[i] = s[(threadIdx.x + 1) % BLOCK] * (float)VEC;
}
extern "C" __global__ void k_two(double* y, int n)
{
    double acc = 0.0;
    for (int j = 0; j < n; ++j) acc += sqrt((double)j + VEC);
    y[threadIdx.x] = acc;
}
'''


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not installed")
def test_a_batch_gives_each_unit_its_own_builds_lines_and_ptx():
    """Units with the same macro, kernel and helper names but other defines: each one's ptxas -v lines (registers,
    spills, stack, shared memory) and each kernel's PTX are those of its own nvcc run; --entry keeps to the
    entries named per unit; a unit that does not compile fails alone with its own error, its neighbours pass."""
    units = [(_UNIT, ("BLOCK=128", "VEC=1")), (_UNIT, ("BLOCK=256", "VEC=4", "SCALE=3")),
             (_UNIT, ("BLOCK=64", "VEC=2"))]
    assert _nvcc.kernels(_UNIT) == ["k_one", "k_two"]
    together = _nvcc.build(units, ptx=True)
    alone = [_nvcc.build([u], ptx=True)[0] for u in units]
    for t, a in zip(together, alone):
        assert t.returncode == a.returncode == 0 and set(t.ptx) == {"k_one", "k_two"}
        assert {k: _nvcc.norm_ptx(v) for k, v in t.ptx.items()} == {k: _nvcc.norm_ptx(v) for k, v in a.ptx.items()}
    assert together[0].ptx["k_one"] != together[1].ptx["k_one"]        # the defines reached each unit
    entries = [("k_one",), ("k_one", "k_two"), ("k_two",)]
    together = _nvcc.build(units, entries=entries)
    for u, e, t in zip(units, entries, together):
        a = _nvcc.build([u], entries=[e])[0]
        assert t.returncode == 0 and _ptxas_lines(t.stderr) == _ptxas_lines(a.stderr), (e, t.stderr, a.stderr)
        assert sorted(__import__("re").findall(r"Compiling entry function '(\w+)'", t.stderr)) == sorted(e)
    broken = [units[0], (_UNIT + "\n#if VEC == 3\n#error three\n#endif\n", ("BLOCK=32", "VEC=3")), units[2]]
    got = _nvcc.build(broken, entries=entries)
    assert [g.returncode != 0 for g in got] == [False, True, False] and "three" in got[1].stderr
    assert _ptxas_lines(got[2].stderr) == _ptxas_lines(together[2].stderr)


def test_every_kernel_source_names_its_kernels():
    """build() renames the kernels it finds: every extern "C" __global__ of the kernel sources is found (one it
    missed would clash between units and send the batch back to one run a unit)."""
    import re

    from minidnn.backend.cuda import launch  # noqa: F401  (the sources' package)
    root = __import__("pathlib").Path(__file__).resolve().parents[1] / "minidnn" / "backend" / "cuda"
    for path in root.glob("*.py"):
        text = path.read_text()
        assert len(_nvcc.KERNEL_RE.findall(text)) == len(re.findall(r'extern\s+"C"\s+__global__', text)), path.name


def test_cover_keeps_the_fixed_items_and_every_value_and_pair_of_values():
    if _nvcc.FULL:
        pytest.skip("MINIDNN_NVCC_ALL=1: every configuration is compiled")
    items = [("k", ("A=0", "B=0")), ("k", ("A=1", "B=1")), ("k", ("A=0", "B=1")), ("k", ("A=1", "B=0")),
             ("j", ("A=0", "B=0")), ("k", ("B=0", "A=0"))]
    got = _nvcc.cover(items, lambda it: _nvcc.define_features([it[0]], it[1]),
                      always=lambda it: it[1] == ("A=1", "B=1"))
    # order kept; the fixed item; k's four pairs of values each built once, j's one build; the last item (k's first
    # build with its defines in another order) adds nothing and is left out
    assert got == items[:5]
    feats = set().union(*(_nvcc.define_features([k], d) for k, d in items))
    assert set().union(*(_nvcc.define_features([k], d) for k, d in got)) == feats
    # with single values only, A=0 / B=0 for k and j's build would do: the pairs are what add items 2 and 3
    singles = _nvcc.cover(items, lambda it: {(it[0], *d.split("=")) for d in it[1]},
                          always=lambda it: it[1] == ("A=1", "B=1"))
    assert singles == [items[0], items[1], items[4]]
    assert _nvcc.cover([], lambda it: {it}) == [] and _nvcc.cover([1, 1, 2], lambda it: {it}) == [1, 2]

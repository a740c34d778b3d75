"""softmax_kernels.COL_WALK, the grid-stride walker of the column softmax kernels and of loss_kernels' spatial
cross-entropy (session 22), compiled as C++ by g++ and run over every thread of small and large grids: each position
(or pair's first position) is visited exactly once, with the offset o * C * inner + i of its class 0 -- one and two
positions a thread, strides that cross several images, and strides that wrap i within an image."""
import shutil
import subprocess

import pytest

from minidnn.backend.cuda import softmax_kernels as _sk

_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv)
{
    const unsigned n = strtoul(argv[1], 0, 10), inner = strtoul(argv[2], 0, 10), C = strtoul(argv[3], 0, 10);
    const unsigned T = strtoul(argv[4], 0, 10), P = strtoul(argv[5], 0, 10);
    const unsigned ci = C * inner, step = P * T;
    std::vector<unsigned char> hit(n / P + 1, 0);
    long long bad = 0, twice = 0;
    for (unsigned t = 0; t < T; ++t)
        for (ColWalk w(P * t, step, inner, ci); w.k < n; w.next(step, inner, ci)) {
            const unsigned o = w.k / inner, i = w.k % inner;
            if (w.off != o * ci + i || w.k % P) ++bad;
            if (hit[w.k / P]++) ++twice;
        }
    long long missed = 0;
    for (unsigned j = 0; j < n / P; ++j) missed += !hit[j];
    printf("%lld %lld %lld\n", bad, twice, missed);
    return 0;
}
"""


@pytest.fixture(scope="module")
def walker(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    d = tmp_path_factory.mktemp("colwalk")
    (d / "w.cpp").write_text("#define __device__\n#define __forceinline__ inline\n" + _sk.COL_WALK + _MAIN)
    subprocess.run(["g++", "-O2", "-o", str(d / "w"), str(d / "w.cpp")], check=True, capture_output=True)
    return str(d / "w")


@pytest.mark.parametrize("n, inner, c, threads, p", [
    (100, 7, 3, 8, 1),                      # a small grid: every thread walks ~12 positions over 14 images
    (144, 36, 19, 5, 2),                    # pairs (inner even)
    (1048576, 65536, 19, 135168, 2),        # the spatial cross-entropy's (16, 19, 256, 256) forward grid
    (524288, 16384, 21, 135168, 1),
    (1000, 2, 5, 7, 2),                     # inner 2: each pair one whole image
    (3 * 1048577, 1048577, 2, 2049, 1),     # an odd inner of 2^20 + 1, strides wrapping i
])
def test_col_walk_visits_every_position_once(walker, n, inner, c, threads, p):
    out = subprocess.run([walker, str(n), str(inner), str(c), str(threads), str(p)], check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    bad, twice, missed = map(int, out)
    assert (bad, twice, missed) == (0, 0, 0), (n, inner, c, threads, p)

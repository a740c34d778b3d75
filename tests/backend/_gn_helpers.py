"""Helpers the group-norm kernel tests share (test_norm_s17_gncl: the cluster kernels; test_norm_s18_gn16, gn16b,
gn16c: the 16-bit stash kernels), written once: an nvcc build of one kernel of a source (the ptxas report, the PTX),
the GPU fixture's check, and the spy that records which kernels a call launched."""
import contextlib
import subprocess

import pytest

from minidnn.backend import devices as _dev

# The fake-CuPy child's group-norm call (test_norm_s17_gncl's and test_norm_s18_gn16's _fake scripts): one forward
# and one backward of random data of ``shape`` with ``groups`` (ones / zeros as parameters where ``affine``), plans
# forgotten first; returns the (kernel, launch dims) the child recorded meanwhile.  The script defines np, fakecp,
# names, B, NK and DTYPE (run's default dtype) before it.
FAKE_RUN = """def run(shape, groups, dtype=DTYPE, affine=True):
    NK._plans.clear()
    rng = np.random.default_rng(0)
    c = shape[1]
    x = fakecp.asarray(rng.standard_normal(shape).astype(dtype))
    sc = fakecp.asarray(np.ones(c, np.float32)) if affine else None
    bi = fakecp.asarray(np.zeros(c, np.float32)) if affine else None
    n0 = len(names)
    y, m, i = B.group_normalization_forward(None, x, groups, sc, bi, 1e-5)
    B.group_normalization_backward(None, x, x, groups, sc, m, i)
    return names[n0:]
"""


def build(tmp_path, source, opts, entry, stem="k", ptx=True):
    """Compile ``source`` with the NVRTC options ``opts`` (their -D defines) for sm_90 as the tests always have:
    a cubin with ptxas's report of ``entry`` (-Xptxas -v), then, with ``ptx``, the module's PTX.  Returns (the ptxas
    report, the PTX text or None); a failed compile fails the test with the compiler's words."""
    from minidnn.backend.cuda import launch
    src = tmp_path / f"{stem}.cu"
    launch.write_source(str(src), source, [o[2:] for o in opts if o.startswith("-D")])
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-ftz=true", "-std=c++17", "-Xptxas", f"-v,--entry={entry}",
                        "-o", str(tmp_path / f"{stem}.cubin"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    if not ptx:
        return r.stderr, None
    out = tmp_path / f"{stem}.ptx"
    q = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-ftz=true", "-std=c++17", "-o", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    return r.stderr, out.read_text()


def entry_body(ptx, entry):
    """The PTX of kernel ``entry`` alone: from its .entry line to the end of its body."""
    body = ptx[ptx.index(f".entry {entry}"):]
    return body[:body.index("\n}\n")]


def gpu(min_cc, why):
    """CuPy on a GPU of compute capability ``min_cc`` or newer (a GPU fixture's body), else the test skips."""
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    cp = _dev.require_cupy()
    if int(cp.cuda.Device().compute_capability) < min_cc:
        pytest.skip(why)
    return cp


@contextlib.contextmanager
def launched(monkeypatch):
    """norm_kernels' plans forgotten on entry and on exit; yields the list of the kernels' names launched (through
    launch.Prepared) in between, in order."""
    from minidnn.backend.cuda import launch
    from minidnn.backend.cuda import norm_kernels as NK
    NK._plans.clear()
    got = []
    real = launch.Prepared.__call__

    def spy(self, *arrays, stream=None):
        got.append(self.kernel.name if hasattr(self.kernel, "name") else str(self.kernel))
        return real(self, *arrays, stream=stream)
    monkeypatch.setattr(launch.Prepared, "__call__", spy)
    try:
        yield got
    finally:
        NK._plans.clear()


def check_env_cases(env_runs, show, cases, import_error):
    """norm_gn16's import-time switches in one interpreter (tests/conftest.py env_runs): ``cases`` is ((environment,
    the line ``show`` prints or None), ...); None means the import fails with ``import_error`` in its traceback."""
    runs = env_runs("minidnn.backend.cuda.norm_gn16", show, [extra for extra, _ in cases], drop=("MINIDNN_GN_STASH16",))
    for (extra, want), (rc, out, err) in zip(cases, runs):
        if want is None:
            assert rc != 0 and import_error in err, (extra, out, err[-800:])
        else:
            assert rc == 0 and out.strip() == want, (extra, out, err[-800:])

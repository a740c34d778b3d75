"""Which kernel configurations the CPU suite compiles with nvcc.

The nvcc checks (no register spills, the hinted instructions in the PTX, the same PTX with a feature off) cost
0.5-5 s of CPU a configuration; compiling every configuration of every kernel was more than half of the CI suite's
time on its 2 cores.  By default a test compiles a spread of its configurations -- the ones it names as always
compiled (those the GPU runs by default) plus an even spread over the rest, first and last included, so every end of
each axis is built -- and ``MINIDNN_NVCC_ALL=1`` compiles all of them (run it before changing a kernel's source:
``MINIDNN_NVCC_ALL=1 python -m pytest -q -n auto tests/backend -k "compile or ptx or spill"``).
"""
import os

FULL = os.environ.get("MINIDNN_NVCC_ALL", "0") == "1"


def pick(items, n, always=()):
    """``items`` (a list, order kept) when ``MINIDNN_NVCC_ALL=1`` or there are at most n; else the items for which
    ``always(item)`` holds (a predicate, or a collection of items) and n of the others, evenly spread, the first and
    the last among them."""
    items = list(items)
    keep = always if callable(always) else (lambda it, s=list(always): it in s)
    if FULL or len(items) <= n:
        return items
    fixed = [i for i, it in enumerate(items) if keep(it)]
    rest = [i for i in range(len(items)) if i not in set(fixed)]
    if n <= 0 or not rest:
        chosen = set()
    elif n == 1:
        chosen = {rest[0]}
    else:
        chosen = {rest[round(k * (len(rest) - 1) / (n - 1))] for k in range(min(n, len(rest)))}
    return [items[i] for i in sorted(set(fixed) | chosen)]



def cover(items, features, always=()):
    """``items`` (order kept) when ``MINIDNN_NVCC_ALL=1``; else the items ``always`` names (a predicate or a
    collection) and then, greedily, the item adding the most features not yet covered (the first such in order)
    until every feature of every item is covered.  ``features(item)`` gives a set of hashables, for a kernel build
    e.g. define_features: every value every define takes for each kernel, and every pair of them that occurs, is
    then compiled at least once."""
    items = list(items)
    if FULL:
        return items
    keep = always if callable(always) else (lambda it, s=list(always): it in s)
    feats = [set(features(it)) for it in items]
    chosen = {i for i, it in enumerate(items) if keep(it)}
    seen = set().union(*(feats[i] for i in chosen)) if chosen else set()
    need = set().union(*feats) if feats else set()
    while seen != need:
        i = max((i for i in range(len(items)) if i not in chosen), key=lambda i: len(feats[i] - seen))
        chosen.add(i)
        seen |= feats[i]
    return [items[i] for i in sorted(chosen)]


def define_features(kernels, defines):
    """cover()'s features of a build that reads ``kernels`` with "NAME=VALUE" ``defines``: each (kernel, name, value)
    and each (kernel, define, define) pair -- so every value of every define, and every pair of values two defines
    take together somewhere, is compiled at least once (session 19: pairs cost ~25 more of the softmax and
    cross-entropy builds, batched a few seconds of CPU, and catch two settings that only spill together)."""
    ds = sorted(set(defines))
    return ({(k, *d.split("=", 1)) for k in kernels for d in ds}
            | {(k, a, b) for k in kernels for i, a in enumerate(ds) for b in ds[i + 1:]})

# ---- several configurations in one nvcc run ------------------------------------------------------------------------
# Most of a small kernel's nvcc run is fixed cost: gcc preprocesses cuda_runtime.h (nvcc force-includes it, about 1 MB
# of text) and cicc parses all of it again, about two thirds of a 0.3 s softmax compile.  build() pays that once for
# several (source, defines) units: each unit goes into its own namespace with its defines and every macro it defines
# undefined after it, and its extern "C" kernels renamed TAG_kernel (extern "C" names ignore namespaces).  A unit
# thus sees the same text it sees alone, its functions keep their own call sites (cicc's inlining), and ptxas
# allocates registers per entry: each kernel's PTX is the same as in the unit's own build up to label numbers and the
# mangled names' lengths, and its ptxas -v lines are the same (tests/test_nvcc_pick.py checks both each run).

import re as _re  # noqa: E402
import shutil as _shutil  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import tempfile as _tempfile  # noqa: E402
from collections import namedtuple as _namedtuple  # noqa: E402

KERNEL_RE = _re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:(?:__launch_bounds__|__cluster_dims__)\s*'
                        r'\([^()]*\)\s*)*(\w+)\s*\(')
_DEFINE_RE = _re.compile(r"^\s*#\s*define\s+(\w+)", _re.M)

Built = _namedtuple("Built", "returncode stderr ptx")
Built.__doc__ = """One unit's result as its own nvcc run would give it: ``stderr`` holds ptxas -v's lines of the unit's
entries (kernel names as in the source), ``ptx`` its entries' PTX text ({kernel: text}, with ``ptx=True``)."""


def kernels(text):
    """The extern "C" __global__ kernels a source defines, in order."""
    return list(dict.fromkeys(KERNEL_RE.findall(text)))


def _tag(i):
    return f"nvccu{i}"


def combine(units):
    """One source text holding every (text, defines) unit; unit i's kernel K is named nvccu{i}_K."""
    out = []
    for i, (text, defines) in enumerate(units):
        tag, ks = _tag(i), kernels(text)
        if _re.search(r"^\s*#\s*(include|pragma\s+once)", text, _re.M):
            raise ValueError(f"unit {i} includes a file: build it alone")
        names = [d.split("=", 1)[0] for d in defines] + _DEFINE_RE.findall(text)
        out.append(f"namespace {tag} {{\n")
        out += [f"#define {k} {tag}_{k}\n" for k in ks]
        out += ["#define {} {}\n".format(*d.split("=", 1)) for d in defines]
        out.append(text + "\n")
        out += [f"#undef {n}\n" for n in dict.fromkeys(names + ks)]
        out.append("}\n")
    return "".join(out)


def _run(src, options, entries, out, ptx):
    if ptx:
        cmd = ["nvcc", "-arch=sm_90", *options, "--ptx", "-o", out, src]
    else:
        xp = ",".join(["-v", *(f"--entry={e}" for e in entries or ())])
        cmd = ["nvcc", "-arch=sm_90", *options, "-cubin", "-Xptxas", xp, "-o", out, src]
    return _subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _split_log(log, tag):
    """ptxas -v's lines of the unit's functions (an entry's section runs from its 'Compiling entry function' line
    to the next function's line), the prefix removed; the lines before the first function (gmem) kept."""
    keep, mine, pre, mangled = [], True, f"{tag}_", f"{len(tag)}{tag}"
    for line in log.splitlines():
        m = _re.search(r"(?:Compiling entry function '|Function properties for )(\w+)", line)
        if m:
            mine = m.group(1).startswith(pre) or mangled in m.group(1)
        if mine:
            keep.append(_own(line, tag))
    return "\n".join(keep) + "\n"


def _split_ptx(ptx, tag):
    """{kernel: its .entry's PTX} of the unit, the prefix removed."""
    pre, out = f"{tag}_", {}
    for m in _re.finditer(r"^\.visible \.entry (\w+)\(.*?^}", ptx, _re.M | _re.S):
        if m.group(1).startswith(pre):
            out[m.group(1)[len(pre):]] = _own(m.group(0), tag)
    return out


def _own(text, tag):
    """The unit's names as in its own build: kernels without the prefix, helpers out of the namespace (single-level
    mangled names: _ZN6nvccu36helperEf is _Z6helperf)."""
    return _re.sub(rf"_ZN{len(tag)}{tag}(\d+\w+?)E", r"_Z\1", text.replace(f"{tag}_", ""))


def norm_ptx(text):
    """A kernel's PTX up to what its place in a batch changes: label and call-sequence numbers, the lengths in
    mangled local names, and a helper's namespace in its mangled name (nvccu3::f is _ZN6nvccu31fE..., ::f _Z1f...)."""
    text = _re.sub(r"_ZN\d+nvccu\d+(\d+\w+?)E", r"_Z\1", text)
    text = _re.sub(r"callseq \d+", "callseq", _re.sub(r"\$L__BB\d+_", "$L__BB_", text))
    return _re.sub(r"_ZZ\d+", "_ZZ", text)


def build(units, options=("-std=c++14",), entries=None, ptx=False, batch=16, tmp=None):
    """Compile (text, defines) units for sm_90 with nvcc, ``batch`` of them a run; [Built] in the units' order.

    ``entries``: None (ptxas builds every kernel) or, per unit, the kernels ptxas builds (-Xptxas --entry).
    ``ptx``: a --ptx build instead; Built.ptx maps each kernel to its .entry's text.  A batch that fails is built
    again unit by unit, so a unit's returncode and error are those of its own run."""
    units = [(text, tuple(defines)) for text, defines in units]
    if entries is not None:
        entries = [tuple(e) for e in entries]
        if len(entries) != len(units):
            raise ValueError("entries: one tuple of kernel names per unit")
    own = tmp is None
    tmp = _tempfile.mkdtemp(prefix="nvccu-") if own else str(tmp)
    try:
        res = []
        for b0 in range(0, len(units), max(1, batch)):
            res += _build_batch(units[b0:b0 + batch], options,
                                None if entries is None else entries[b0:b0 + batch], ptx, tmp, b0)
        return res
    finally:
        if own:
            _shutil.rmtree(tmp, True)


def _alone(text, defines, options, ents, ptx, path):
    src = path + ".cu"
    with open(src, "w") as f:
        f.write("".join("#define {} {}\n".format(*d.split("=", 1)) for d in defines) + text)
    r = _run(src, options, ents, path + (".ptx" if ptx else ".cubin"), ptx)
    p = None
    if ptx and r.returncode == 0:
        with open(path + ".ptx") as f:
            p = _split_ptx(_re.sub(r"^(\.visible \.entry )", r"\1nvccu0_", f.read(), flags=_re.M), _tag(0))
    return Built(r.returncode, r.stdout + r.stderr, p)


def _build_batch(units, options, entries, ptx, tmp, b0):
    base = f"{tmp}/b{b0}"
    if len(units) == 1:
        return [_alone(*units[0], options, entries and entries[0], ptx, base)]
    with open(base + ".cu", "w") as f:
        f.write(combine(units))
    ents = None if entries is None else [f"{_tag(i)}_{k}" for i, e in enumerate(entries) for k in e]
    r = _run(base + ".cu", options, ents, base + (".ptx" if ptx else ".cubin"), ptx)
    if r.returncode != 0:
        return [_alone(t, d, options, entries and entries[i], ptx, f"{base}_{i}") for i, (t, d) in enumerate(units)]
    text = open(base + ".ptx").read() if ptx else None
    return [Built(0, _split_log(r.stdout + r.stderr, _tag(i)), text and _split_ptx(text, _tag(i)))
            for i in range(len(units))]

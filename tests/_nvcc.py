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

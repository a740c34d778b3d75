"""Every arrow points down (issue 13): no import cycle between the package's modules or parts, the backend imports
nothing above it, and the engine (tensor, autograd) imports only the backend and its own small helpers."""
import functools
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "import_graph", pathlib.Path(__file__).resolve().parent.parent / "tools" / "import_graph.py")
ig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ig)
# One parse of the package for the module's tests (~1.2 s each; this module's own copy of the tool, no test edits
# the graphs)
ig.module_graph = functools.lru_cache(maxsize=None)(ig.module_graph)


def test_no_cycles_between_parts():
    assert ig.cycles(ig.layer_graph()) == []


def test_no_cycles_between_modules_even_through_deferred_imports():
    # an import inside a function that closes a loop is a cycle too (only the package's face imports from it)
    assert ig.cycles(ig.module_graph()) == []


def test_backend_and_engine_sit_at_the_bottom():
    g = ig.layer_graph()
    assert g.get("minidnn.backend", set()) == set(), g.get("minidnn.backend")
    allowed = {"minidnn.backend", "minidnn.autograd", "minidnn._amp_state", "minidnn._dlpack", "minidnn._dtypes",
               "minidnn._memory_format"}
    assert g.get("minidnn.tensor", set()) <= allowed, g["minidnn.tensor"]
    assert g.get("minidnn.autograd", set()) <= allowed - {"minidnn.autograd"}, g["minidnn.autograd"]
    for top in ("minidnn.nn", "minidnn.optim", "minidnn.data", "minidnn.models"):
        for low in ("minidnn.tensor", "minidnn.autograd", "minidnn.backend"):
            assert top not in g.get(low, set())


def test_a_planted_cycle_is_found():
    assert ig.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_helpers_below_the_tensor_import_only_the_backend():
    g = ig.layer_graph()
    for low in ("minidnn._dtypes", "minidnn._dlpack", "minidnn._memory_format", "minidnn._amp_state"):
        assert g.get(low, set()) <= {"minidnn.backend"}, (low, g.get(low))

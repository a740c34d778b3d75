"""The package's shape: the public namespace is exactly ``__all__``, one version string, and no import cycles in the
core (tensor.py imports nothing above it)."""
import ast
import importlib
import importlib.metadata
import pathlib

import minidnn as mdn

ROOT = pathlib.Path(mdn.__file__).parent


def test_public_namespace_is_exactly_all():
    public = {n for n in dir(mdn) if not n.startswith("_")}
    assert public == set(mdn.__all__)
    assert len(mdn.__all__) == len(set(mdn.__all__))
    for name in mdn.__all__:
        assert hasattr(mdn, name), name
    for internal in ("elementwise", "reduction", "linalg", "shape", "indexing", "annotations", "ops"):
        assert internal not in public


def test_star_import_gives_all():
    ns = {}
    exec("from minidnn import *", ns)
    assert {n for n in ns if not n.startswith("__")} == set(mdn.__all__)


def test_one_version_string():
    """pyproject.toml holds the version; the package reads it (importlib.metadata) instead of repeating it."""
    text = (ROOT.parent / "pyproject.toml").read_text()
    declared = next(line.split("=", 1)[1].strip().strip('"') for line in text.splitlines()
                    if line.startswith("version"))
    assert mdn.__version__ == declared == mdn.backend.__version__
    written = [p for p in ROOT.rglob("*.py") if declared in p.read_text()]
    assert not written, f"the version string is written again in {written}"
    try:
        assert importlib.metadata.version("minidnn") == declared
    except importlib.metadata.PackageNotFoundError:     # a never-installed checkout
        pass


def _imports(path):
    """Module names imported at module level (not inside functions) by the file at ``path``."""
    tree = ast.parse(path.read_text())
    pkg = path.relative_to(ROOT.parent).with_suffix("").parts
    pkg = pkg[:-1] if pkg[-1] != "__init__" else pkg[:-1]
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                mod = ".".join(base + ((node.module,) if node.module else ()))
            else:
                mod = node.module or ""
            out.add(mod)
            for alias in node.names:
                out.add(f"{mod}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("minidnn.")}


def test_tensor_and_autograd_import_nothing_above_them():
    """The engine's floor: tensor.py and autograd.py reach only the backend and private helpers at module level."""
    allowed = ("minidnn.backend", "minidnn._", "minidnn.autograd", "minidnn.tensor", "minidnn._amp_state")
    for name in ("tensor.py", "autograd.py"):
        above = sorted(m for m in _imports(ROOT / name) if not m.startswith(allowed))
        assert not above, f"{name} imports {above} at module level"


def test_backend_imports_nothing_above_it():
    for path in (ROOT / "backend").rglob("*.py"):
        above = sorted(m for m in _imports(path) if not m.startswith("minidnn.backend"))
        assert not above, f"{path.relative_to(ROOT)} imports {above}"

"""``minidnn.viz``: draw the backward graph of a tensor as Graphviz DOT text, and as a picture where Graphviz is.

    dot = minidnn.viz.to_dot(loss, params=dict(model.named_parameters()))
    minidnn.viz.draw(dot, "graph.png")   # graph.dot always; graph.png too when Graphviz's `dot` is installed
    minidnn.viz.render(dot)              # in Jupyter: a picture when Graphviz is installed, else the text

Graphviz is a system program, not a Python package minidnn could depend on: ``apt-get install graphviz``,
``brew install graphviz``, ``conda install graphviz`` or https://graphviz.org/download/.  Without it, ``draw``
still saves the DOT file (any Graphviz viewer, or an online one, shows it) and says how to get Graphviz.

Nodes: the output tensor (green box), one ellipse per backward node (``node.name()``: MulBackward,
MatmulBackward, ...), one box per leaf (its AccumulateGrad node: parameter name when ``params`` names it,
and shape).  Edges run from inputs to outputs, following ``node.next_edges`` backwards.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import warnings

from .autograd import AccumulateGrad

__all__ = ["to_dot", "render", "draw", "graphviz_available", "GRAPHVIZ_HINT"]

GRAPHVIZ_HINT = ("Graphviz's `dot` program is not installed, so no picture was rendered. Get it with "
                 "`apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
                 "`conda install graphviz`, or from https://graphviz.org/download/")


def _quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape(t):
    return str(tuple(int(s) for s in t.shape))


def to_dot(tensor, params=None, show_saved: bool = False, graph_name: str = "backward") -> str:
    """DOT text of the graph that ``tensor.backward()`` would walk (iterative: any depth works).

    ``params``: ``{name: tensor}`` used to label leaves (e.g. ``dict(model.named_parameters())``);
    ``show_saved``: list the shapes of the tensors each node saved for backward."""
    param_names = {id(t): name for name, t in (params or {}).items()}
    ids = {}

    def node_id(node):
        if node not in ids:
            ids[node] = f"n{len(ids)}"
        return ids[node]

    lines = [f"digraph {graph_name} {{",
             '  node [style=filled, shape=box, align=left, fontsize=10, height=0.2];']
    root_name = param_names.get(id(tensor), "output")
    lines.append(f'  out [label={_quote(root_name + chr(10) + _shape(tensor))}, fillcolor=darkolivegreen1];')
    edges = []
    start = tensor._edge()[0] if tensor.requires_grad else None
    if start is not None:
        edges.append(f"  {node_id(start)} -> out;")
    stack = [start] if start is not None else []
    visited = set()
    while stack:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        nid = node_id(node)
        if isinstance(node, AccumulateGrad):
            var = node.variable
            label = (param_names[id(var)] + "\n" if id(var) in param_names else "") + _shape(var)
            lines.append(f"  {nid} [label={_quote(label)}, fillcolor=lightblue];")
        else:
            label = node.name()
            if show_saved and node.saved:
                label += "\nsaved: " + ", ".join(_shape(t) for t in node.saved if hasattr(t, "shape"))
            lines.append(f"  {nid} [label={_quote(label)}, shape=ellipse, fillcolor=lightgray];")
        for edge in node.next_edges:
            if edge is None:
                continue
            child = edge[0]
            edges.append(f"  {node_id(child)} -> {nid};")
            if child not in visited:
                stack.append(child)
    return "\n".join(lines + edges + ["}"]) + "\n"


def graphviz_available() -> bool:
    """Whether Graphviz's ``dot`` program is on the PATH."""
    return shutil.which("dot") is not None


def _dot_text(graph, **to_dot_kwargs):
    return graph if isinstance(graph, str) else to_dot(graph, **to_dot_kwargs)


def draw(graph, path="graph.png", **to_dot_kwargs) -> str:
    """Save ``graph`` (DOT text, or a tensor whose backward graph ``to_dot`` draws, with ``to_dot_kwargs``).

    Always writes the DOT source beside ``path`` (``graph.png`` -> ``graph.dot``); when Graphviz's ``dot`` is
    installed, also renders ``path`` (its extension picks the format: .png, .svg, .pdf).  Returns the path of
    the picture, or of the DOT file (with a warning saying how to get Graphviz) when there is no ``dot``."""
    text = _dot_text(graph, **to_dot_kwargs)
    root, ext = os.path.splitext(os.fspath(path))
    fmt = ext.lstrip(".").lower() or "png"
    dot_path = root + ".dot"
    with open(dot_path, "w") as f:
        f.write(text)
    if fmt == "dot":
        return dot_path
    if not graphviz_available():
        warnings.warn(f"{GRAPHVIZ_HINT}. The graph's DOT source is saved in {dot_path}.", stacklevel=2)
        return dot_path
    out_path = root + "." + fmt
    subprocess.run(["dot", f"-T{fmt}", dot_path, "-o", out_path], check=True, capture_output=True)
    return out_path


class _SVG:
    """An SVG picture that Jupyter displays (``_repr_svg_``) without IPython or the graphviz package."""

    def __init__(self, svg: str, source: str):
        self.svg, self.source = svg, source

    def _repr_svg_(self):
        return self.svg

    def __str__(self):
        return self.source


def render(dot_text: str):
    """Something Jupyter displays as the picture: a ``graphviz.Source`` when the ``graphviz`` Python package
    is importable, else an SVG made by Graphviz's ``dot`` program when it is installed; otherwise the DOT
    text itself, with a warning saying how to get Graphviz (paste the text into any Graphviz viewer)."""
    try:
        import graphviz
    except ImportError:
        graphviz = None
    if graphviz is not None:
        return graphviz.Source(dot_text)
    if graphviz_available():
        svg = subprocess.run(["dot", "-Tsvg"], input=dot_text, capture_output=True, text=True, check=True).stdout
        return _SVG(svg, dot_text)
    warnings.warn(GRAPHVIZ_HINT, stacklevel=2)
    return dot_text

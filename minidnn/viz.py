"""``minidnn.viz``: draw the backward graph of a tensor as Graphviz DOT text.

    dot = minidnn.viz.to_dot(loss, params=dict(model.named_parameters()))
    minidnn.viz.render(dot)     # an SVG in Jupyter when the ``graphviz`` package is installed, else the text

Nodes: the output tensor (green box), one ellipse per backward node (``node.name()``: MulBackward,
MatmulBackward, ...), one box per leaf (its AccumulateGrad node: parameter name when ``params`` names it,
and shape).  Edges run from inputs to outputs, following ``node.next_edges`` backwards.
"""
from __future__ import annotations

from .autograd import AccumulateGrad

__all__ = ["to_dot", "render"]


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


def render(dot_text: str):
    """A ``graphviz.Source`` (which Jupyter displays as a picture) when the ``graphviz`` Python package is
    importable; otherwise the DOT text itself (paste it into any Graphviz viewer, or ``dot -Tsvg``)."""
    try:
        import graphviz
    except ImportError:
        return dot_text
    return graphviz.Source(dot_text)

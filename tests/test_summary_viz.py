"""minidnn.summary (numbers checked by hand and against PyTorch's parameter count) and minidnn.viz.to_dot."""
import re
import sys

import pytest

import minidnn as mdn
from minidnn import nn


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.Identity(), nn.Linear(128, 10))


def test_summary_of_mlp_matches_hand_counts(capsys):
    model = _mlp()
    s = mdn.summary(model, (1, 28, 28), batch_size=16)
    assert capsys.readouterr().out.strip() == str(s)        # verbose=1 prints the table it returns
    params = 784 * 128 + 128 + 128 * 10 + 10
    assert s.total_params == s.trainable_params == params == 101_770
    assert s.non_trainable_params == 0
    assert s.total_mult_adds == 16 * (784 * 128 + 128 * 10)
    assert s.input_size_bytes == 16 * 784 * 4
    leaf_outputs = 16 * (784 + 128 + 128 + 10) * 4
    assert s.forward_backward_pass_size_bytes == 2 * leaf_outputs
    assert s.params_size_bytes == params * 4
    assert s.total_size_bytes == s.input_size_bytes + 2 * leaf_outputs + params * 4
    assert [(r.type, r.name, r.depth) for r in s.rows] == [
        ("Sequential", "", 0), ("Flatten", "0", 1), ("Linear", "1", 1), ("Identity", "2", 1), ("Linear", "3", 1)]
    assert [r.output_shapes for r in s.rows] == [[(16, 10)], [(16, 784)], [(16, 128)], [(16, 128)], [(16, 10)]]
    text = str(s)
    for needle in ["Total params: 101,770", "Trainable params: 101,770", "Total mult-adds: 1,626,112",
                   "├─Linear (1)", "[16, 128]", "100,480", "Params size (MB): 0.41"]:
        assert needle in text, needle


def test_summary_param_count_matches_torch():
    torch = pytest.importorskip("torch")
    t = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.Identity(),
                            torch.nn.Linear(128, 10))
    s = mdn.summary(_mlp(), (2, 784), verbose=0)
    assert s.total_params == sum(p.numel() for p in t.parameters())


def test_summary_nesting_sharing_frozen_and_state_restored():
    shared = nn.Linear(8, 8)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(shared, shared), nn.Linear(8, 2, bias=False))
    model[0].requires_grad_(False)
    model.train()
    s = mdn.summary(model, (3, 4), verbose=0)
    assert [(r.name, r.depth, r.recursive) for r in s.rows] == [
        ("", 0, False), ("0", 1, False), ("1", 1, False), ("1.0", 2, False), ("1.0", 2, True), ("2", 1, False)]
    assert s.total_params == 40 + 72 + 16 and s.trainable_params == 72 + 16
    assert s.total_mult_adds == 3 * (4 * 8 + 8 * 8 * 2 + 8 * 2)        # each call of the shared layer counts
    assert "(recursive)" in str(s) and "│    ├─Linear (1.0)" in str(s)
    assert all(m.training for m in model.modules())             # modes restored after the eval-mode pass
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())   # hooks removed


def test_summary_macs_protocol_and_integer_inputs():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(mdn.ones(1))

        def forward(self, x):
            return x * self.s

        def _macs(self, input, output):
            return input.numel()

    model = nn.Sequential(nn.Embedding(50, 6), Scale(), nn.Flatten(), nn.Linear(24, 3))
    s = mdn.summary(model, (2, 4), dtype=mdn.int64, verbose=0)
    assert s.rows[1].output_shapes == [(2, 4, 6)]
    assert s.total_mult_adds == 2 * 4 * 6 + 2 * 24 * 3
    assert s.input_size_bytes == 2 * 4 * 8
    x = mdn.zeros(5, 4, dtype=mdn.int64)
    assert mdn.summary(model, input_data=x, verbose=0).rows[-1].output_shapes == [(5, 3)]
    with pytest.raises(ValueError, match="input_shape"):
        mdn.summary(model)


def test_summary_on_device(device):
    model = _mlp().to(device)
    s = mdn.summary(model, (2, 784), verbose=0)
    assert s.total_params == 101_770


# ----------------------------------------------------------------------------------------------
# viz
# ----------------------------------------------------------------------------------------------
def _check_dot(dot):
    assert dot.startswith("digraph ") and dot.rstrip().endswith("}")
    body = re.sub(r'"(?:[^"\\]|\\.)*"', '""', dot)           # drop quoted labels before counting braces
    assert body.count("{") == body.count("}") == 1
    declared = set(re.findall(r"^\s*(\w+) \[", dot, re.M)) - {"node"}
    edges = re.findall(r"^\s*(\w+) -> (\w+);", dot, re.M)
    for a, b in edges:
        assert a in declared and b in declared, (a, b)
    return declared, edges


def test_to_dot_names_ops_params_and_shapes():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    x = mdn.randn(5, 4)
    loss = (model(x) * 2).sum()
    dot = mdn.viz.to_dot(loss, params=dict(model.named_parameters()), show_saved=True)
    declared, edges = _check_dot(dot)
    # (a linear layer is one node, as PyTorch's AddmmBackward: nn/_functions/linear.py)
    for needle in ["SumBackward", "MulBackward", "LinearBackward", "0.weight\\n(3, 4)",
                   "0.bias\\n(3,)", "1.weight\\n(2, 3)", "1.bias\\n(2,)", "saved: (5, 4)", "output\\n()"]:
        assert needle in dot, needle
    # One box per parameter, each feeding exactly one op.
    boxes = re.findall(r"^\s*(\w+) \[label=\"\d\.(?:weight|bias)", dot, re.M)
    assert len(boxes) == dot.count("fillcolor=lightblue") == 4
    assert all(sum(1 for s, _ in edges if s == box) == 1 for box in boxes)


def test_to_dot_unnamed_leaves_and_shared_nodes():
    a = mdn.randn(3, requires_grad=True)
    b = a * a + a            # `a` feeds three edges; its box appears once
    dot = mdn.viz.to_dot(b)
    declared, edges = _check_dot(dot)
    assert dot.count("fillcolor=lightblue") == 1 and "(3,)" in dot
    leaf = re.search(r"(\w+) \[label=\"\(3,\)\"", dot).group(1)
    assert sum(1 for s, _ in edges if s == leaf) == 3
    # A tensor without history: just the output box.
    assert "->" not in mdn.viz.to_dot(mdn.ones(2))


def test_to_dot_is_iterative_on_deep_graphs():
    x = mdn.ones(1, requires_grad=True)
    y = x
    for _ in range(3000):
        y = y * 1.0
    dot = mdn.viz.to_dot(y)
    assert dot.count("MulBackward") == 3000


def test_render_falls_back_to_text(monkeypatch):
    dot = mdn.viz.to_dot(mdn.ones(2, requires_grad=True).sum())
    try:
        import graphviz
    except ImportError:
        monkeypatch.setattr(mdn.viz.shutil, "which", lambda name: None)     # nor Graphviz's dot program
        with pytest.warns(UserWarning, match="graphviz"):
            out = mdn.viz.render(dot)
        assert out == dot
    else:
        assert isinstance(mdn.viz.render(dot), graphviz.Source) and mdn.viz.render(dot).source == dot


def test_render_uses_the_dot_program_without_the_python_package(monkeypatch):
    if mdn.viz.shutil.which("dot") is None:
        pytest.skip("Graphviz's dot program is not installed (tests/test_first_run.py fakes it for draw)")
    monkeypatch.setitem(sys.modules, "graphviz", None)
    out = mdn.viz.render(mdn.viz.to_dot(mdn.ones(2, requires_grad=True).sum()))
    assert "<svg" in out._repr_svg_() and str(out).startswith("digraph")

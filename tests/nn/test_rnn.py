"""RNN, LSTM, GRU and their cells against PyTorch: PyTorch's state_dict loaded as is, outputs, final states and
the gradients of the input, the initial states and every parameter (float64), over every option."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
from minidnn.autograd import gradcheck

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for the recurrent layers")
TOL = dict(rtol=1e-10, atol=1e-12)


def _load(m, t):
    m.load_state_dict({k: mdn.tensor(v.detach().numpy().copy()) for k, v in t.state_dict().items()})


def _close(a, t):
    np.testing.assert_allclose(a.detach().cpu().numpy(), t.detach().numpy(), **TOL)


def _t(x, device, grad=True):
    return mdn.tensor(x, device=device, requires_grad=grad), torch.tensor(x, requires_grad=grad)


CASES = [
    ("RNN", {}), ("RNN", dict(nonlinearity="relu", num_layers=2)), ("RNN", dict(bidirectional=True, bias=False)),
    ("LSTM", {}), ("LSTM", dict(num_layers=2, bidirectional=True)), ("LSTM", dict(batch_first=True, num_layers=3)),
    ("LSTM", dict(proj_size=3, num_layers=2, bidirectional=True)), ("LSTM", dict(bias=False)),
    ("GRU", {}), ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True)), ("GRU", dict(bias=False)),
]


@pytest.mark.parametrize("with_hx", [False, True])
@pytest.mark.parametrize("kind,kw", CASES)
def test_layer_matches_pytorch(kind, kw, with_hx, device):
    n_in, H, T, N = 4, 5, 6, 3
    torch.manual_seed(0)
    t = getattr(torch.nn, kind)(n_in, H, **kw).double()
    m = getattr(nn, kind)(n_in, H, dtype=mdn.float64, **kw)
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in t.named_parameters()]
    _load(m, t)
    m.to(device)
    rng = np.random.default_rng(1)
    x, tx = _t(rng.standard_normal((N, T, n_in) if kw.get("batch_first") else (T, N, n_in)), device)
    D, L = (2 if kw.get("bidirectional") else 1), kw.get("num_layers", 1)
    hx = thx = None
    if with_hx:
        h, th = _t(rng.standard_normal((D * L, N, kw.get("proj_size") or H)), device)
        if kind == "LSTM":
            c, tc = _t(rng.standard_normal((D * L, N, H)), device)
            hx, thx = (h, c), (th, tc)
        else:
            hx, thx = h, th
    y, hn = m(x, hx)
    ty, thn = t(tx, thx)
    _close(y, ty)
    hn, thn = (hn if kind == "LSTM" else (hn,)), (thn if kind == "LSTM" else (thn,))
    for a, b in zip(hn, thn):
        _close(a, b)
    g = rng.standard_normal(tuple(ty.shape))
    loss = (y * mdn.tensor(g, device=device)).sum() + sum((a * a).sum() for a in hn)
    tloss = (ty * torch.tensor(g)).sum() + sum((b * b).sum() for b in thn)
    loss.backward()
    tloss.backward()
    _close(x.grad, tx.grad)
    if with_hx:
        for a, b in zip(hx if kind == "LSTM" else (hx,), thx if kind == "LSTM" else (thx,)):
            _close(a.grad, b.grad)
    tp = dict(t.named_parameters())
    for n, p in m.named_parameters():
        _close(p.grad, tp[n].grad)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_unbatched_input(kind):
    torch.manual_seed(2)
    t = getattr(torch.nn, kind)(3, 4, bidirectional=True).double()
    m = getattr(nn, kind)(3, 4, bidirectional=True, dtype=mdn.float64)
    _load(m, t)
    x = np.random.default_rng(3).standard_normal((5, 3))
    y, hn = m(mdn.tensor(x))
    ty, thn = t(torch.tensor(x))
    _close(y, ty)
    for a, b in zip(hn if kind == "LSTM" else (hn,), thn if kind == "LSTM" else (thn,)):
        _close(a, b)


def test_init_is_pytorchs_uniform_and_dropout_between_layers():
    m = nn.LSTM(10, 16, num_layers=2)
    bound = 1 / 4
    for p in m.parameters():
        assert np.abs(p.numpy()).max() <= bound
    assert max(np.abs(p.numpy()).max() for p in m.parameters()) > 0.95 * bound
    m = nn.GRU(3, 4, num_layers=2, dropout=0.5)
    x = mdn.randn(5, 2, 3)
    m.eval()
    np.testing.assert_array_equal(m(x)[0].numpy(), m(x)[0].numpy())
    m.train()
    mdn.manual_seed(0)
    a = m(x)[0].numpy()
    mdn.manual_seed(1)
    assert not np.allclose(a, m(x)[0].numpy())           # dropout acts in training between layers
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.2)


@pytest.mark.parametrize("kind,kw", [("RNNCell", {}), ("RNNCell", dict(nonlinearity="relu", bias=False)),
                                     ("LSTMCell", {}), ("LSTMCell", dict(bias=False)), ("GRUCell", {}),
                                     ("GRUCell", dict(bias=False))])
@pytest.mark.parametrize("batched", [True, False])
def test_cells_match_pytorch(kind, kw, batched, device):
    torch.manual_seed(4)
    t = getattr(torch.nn, kind)(3, 5, **kw).double()
    m = getattr(nn, kind)(3, 5, dtype=mdn.float64, **kw)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    _load(m, t)
    m.to(device)
    rng = np.random.default_rng(5)
    lead = (4,) if batched else ()
    x, tx = _t(rng.standard_normal(lead + (3,)), device)
    h, th = _t(rng.standard_normal(lead + (5,)), device)
    if kind == "LSTMCell":
        c, tc = _t(rng.standard_normal(lead + (5,)), device)
        out, tout = m(x, (h, c)), t(tx, (th, tc))
    else:
        out, tout = (m(x, h),), (t(tx, th),)
    for a, b in zip(out, tout):
        _close(a, b)
    sum((a * a).sum() for a in out).backward()
    sum((b * b).sum() for b in tout).backward()
    _close(x.grad, tx.grad)
    _close(h.grad, th.grad)
    tp = dict(t.named_parameters())
    for n, p in m.named_parameters():
        _close(p.grad, tp[n].grad)
    # no hidden state given: zeros
    out0 = m(x.detach())
    tout0 = t(tx.detach())
    for a, b in zip(out0 if kind == "LSTMCell" else (out0,), tout0 if kind == "LSTMCell" else (tout0,)):
        _close(a, b)


def test_unbind_time_gradcheck():
    from minidnn.nn.layers.rnn import _UnbindTime
    x = mdn.tensor(np.random.default_rng(6).standard_normal((4, 2, 3)), requires_grad=True)
    assert gradcheck(lambda a: mdn.stack([s * (i + 1) for i, s in enumerate(_UnbindTime.apply(a))]), (x,))


def test_float32_lstm_close_to_pytorch():
    torch.manual_seed(7)
    t = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    m = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    _load(m, t)
    x = np.random.default_rng(8).standard_normal((4, 12, 8)).astype(np.float32)
    y, _ = m(mdn.tensor(x))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), t(torch.tensor(x))[0].detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call,exc", [
    (lambda: nn.LSTM(3, 4)(mdn.zeros(5, 2, 2)), RuntimeError),
    (lambda: nn.GRU(3, 4)(mdn.zeros(5, 2, 3), mdn.zeros(2, 2, 4)), RuntimeError),
    (lambda: nn.LSTM(3, 4)(mdn.zeros(5, 2, 3), mdn.zeros(1, 2, 4)), TypeError),
    (lambda: nn.RNN(3, 4, nonlinearity="gelu"), ValueError),
    (lambda: nn.GRU(3, 4, proj_size=2), TypeError),
    (lambda: nn.LSTM(3, 4, proj_size=4), ValueError),
    (lambda: nn.LSTMCell(3, 4)(mdn.zeros(2, 5)), RuntimeError),
    (lambda: nn.RNN(3, 4)(mdn.zeros(2, 2, 2, 3)), ValueError),
])
def test_errors(call, exc):
    with pytest.raises(exc):
        call()


# ---- variable-length sequences: nn.utils.rnn and PackedSequence inputs -----------------------------------------
from minidnn.nn.utils import rnn as mrnn  # noqa: E402


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted,lengths", [(True, [5, 3, 3, 1]), (False, [2, 5, 1, 4]),
                                                    (False, [3, 3, 3, 3])])
def test_pack_pad_round_trip_matches_pytorch(batch_first, enforce_sorted, lengths):
    tu = torch.nn.utils.rnn
    T, B = max(lengths), len(lengths)
    x = np.random.default_rng(0).standard_normal((B, T, 3) if batch_first else (T, B, 3))
    a, t = _t(x, "cpu")
    p = mrnn.pack_padded_sequence(a, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    tp = tu.pack_padded_sequence(t, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=enforce_sorted)
    _close(p.data, tp.data)
    np.testing.assert_array_equal(p.batch_sizes.numpy(), tp.batch_sizes.numpy())
    y, n = mrnn.pad_packed_sequence(p, batch_first=batch_first, padding_value=-1.0, total_length=T + 1)
    ty, tn = tu.pad_packed_sequence(tp, batch_first=batch_first, padding_value=-1.0, total_length=T + 1)
    _close(y, ty)
    np.testing.assert_array_equal(n.numpy(), tn.numpy())
    g = np.random.default_rng(1).standard_normal(tuple(ty.shape))
    y.backward(mdn.tensor(g))
    ty.backward(torch.tensor(g))
    _close(a.grad, t.grad)


def test_pad_sequence_pack_sequence_unpack():
    tu = torch.nn.utils.rnn
    seqs = [np.random.default_rng(i).standard_normal((n, 2)) for i, n in enumerate([3, 5, 1])]
    for bf in (False, True):
        for side in ("right", "left"):
            _close(mrnn.pad_sequence([mdn.tensor(s) for s in seqs], batch_first=bf, padding_value=9.0,
                                     padding_side=side),
                   tu.pad_sequence([torch.tensor(s) for s in seqs], batch_first=bf, padding_value=9.0,
                                   padding_side=side))
    p = mrnn.pack_sequence([mdn.tensor(s) for s in seqs], enforce_sorted=False)
    tp = tu.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted=False)
    _close(p.data, tp.data)
    for a, b in zip(mrnn.unpack_sequence(p), tu.unpack_sequence(tp)):
        _close(a, b)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        mrnn.pack_sequence([mdn.tensor(s) for s in seqs])


@pytest.mark.parametrize("kind,kw", [("LSTM", dict(num_layers=2, bidirectional=True)),
                                     ("GRU", dict(bidirectional=True)), ("RNN", dict(num_layers=2)),
                                     ("LSTM", dict(proj_size=2, bidirectional=True))])
@pytest.mark.parametrize("with_hx", [False, True])
def test_packed_input_matches_pytorch(kind, kw, with_hx, device):
    tu = torch.nn.utils.rnn
    n_in, H, lengths = 3, 4, [2, 5, 1, 4]
    T, N = max(lengths), len(lengths)
    torch.manual_seed(1)
    t = getattr(torch.nn, kind)(n_in, H, batch_first=True, **kw).double()
    m = getattr(nn, kind)(n_in, H, batch_first=True, dtype=mdn.float64, **kw)
    _load(m, t)
    m.to(device)
    rng = np.random.default_rng(2)
    x, tx = _t(rng.standard_normal((N, T, n_in)), device)
    D, L = (2 if kw.get("bidirectional") else 1), kw.get("num_layers", 1)
    hx = thx = None
    if with_hx:
        h, th = _t(rng.standard_normal((D * L, N, kw.get("proj_size") or H)), device)
        if kind == "LSTM":
            c, tc = _t(rng.standard_normal((D * L, N, H)), device)
            hx, thx = (h, c), (th, tc)
        else:
            hx, thx = h, th
    p = mrnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    tp = tu.pack_padded_sequence(tx, torch.tensor(lengths), batch_first=True, enforce_sorted=False)
    out, hn = m(p, hx)
    tout, thn = t(tp, thx)
    assert isinstance(out, mrnn.PackedSequence)
    _close(out.data, tout.data)
    y, _ = mrnn.pad_packed_sequence(out, batch_first=True)
    ty, _ = tu.pad_packed_sequence(tout, batch_first=True)
    _close(y, ty)
    hn, thn = (hn if kind == "LSTM" else (hn,)), (thn if kind == "LSTM" else (thn,))
    for a, b in zip(hn, thn):
        _close(a, b)
    g = rng.standard_normal(tuple(ty.shape))
    ((y * mdn.tensor(g, device=device)).sum() + sum((a * a).sum() for a in hn)).backward()
    ((ty * torch.tensor(g)).sum() + sum((b * b).sum() for b in thn)).backward()
    _close(x.grad, tx.grad)
    if with_hx:
        for a, b in zip(hx if kind == "LSTM" else (hx,), thx if kind == "LSTM" else (thx,)):
            _close(a.grad, b.grad)
    tp_ = dict(t.named_parameters())
    for n_, prm in m.named_parameters():
        _close(prm.grad, tp_[n_].grad)


def test_split_rows_gradcheck():
    x = mdn.tensor(np.random.default_rng(3).standard_normal((6, 2)), requires_grad=True)
    assert gradcheck(lambda a: mdn.cat([b * (i + 1) for i, b in enumerate(mrnn.split_rows(a, [3, 2, 1]))], 0), (x,))


def test_double_backward_through_lstm_and_packed_gru():
    """create_graph=True differentiates the recurrences again (every piece is a Tensor op)."""
    from minidnn.autograd import gradgradcheck
    mdn.manual_seed(0)
    lstm = nn.LSTM(2, 3, dtype=mdn.float64)
    x = mdn.tensor(np.random.default_rng(0).standard_normal((3, 2, 2)), requires_grad=True)
    assert gradgradcheck(lambda a: lstm(a)[0], (x,))
    gru = nn.GRU(2, 2, bidirectional=True, dtype=mdn.float64)
    assert gradgradcheck(lambda a: gru(mrnn.pack_padded_sequence(a, [3, 1], enforce_sorted=False))[0].data, (x,))

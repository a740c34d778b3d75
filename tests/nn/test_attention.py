"""nn.MultiheadAttention and F.scaled_dot_product_attention against PyTorch (float64, weights copied across):
outputs, attention weights and the gradients of inputs and every parameter, over the mask kinds and options."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for attention")
TF = torch.nn.functional
TOL = dict(rtol=1e-10, atol=1e-12)


def _pair(shape, device, seed, requires_grad=True):
    x = np.random.default_rng(seed).standard_normal(shape)
    return mdn.tensor(x, device=device, requires_grad=requires_grad), torch.tensor(x, requires_grad=requires_grad)


def _close(a, t, **kw):
    np.testing.assert_allclose(a.cpu().numpy() if hasattr(a, "cpu") else a, t.detach().numpy(), **(kw or TOL))


@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "causal", "scale", "broadcast_mask", "3d",
                                  "gqa", "cross"])
def test_sdpa_matches_pytorch(case, device):
    N, H, L, S, E = 2, 4, 5, 5, 6
    if case == "cross":
        S = 7
    qs, ks = (N, H, L, E), (N, H, S, E)
    if case == "3d":
        qs, ks = (N, L, E), (N, S, E)
    if case == "gqa":
        ks = (N, 2, S, E)
    (q, tq), (k, tk), (v, tv) = _pair(qs, device, 0), _pair(ks, device, 1), _pair(ks[:-1] + (3,), device, 2)
    kw, tkw = {}, {}
    rng = np.random.default_rng(3)
    if case == "bool_mask":
        m = rng.random((N, H, L, S)) > 0.3
        m[..., 0] = True                                        # no fully masked row
        kw["attn_mask"], tkw["attn_mask"] = mdn.tensor(m, device=device), torch.tensor(m)
    if case == "broadcast_mask":
        m = np.tril(np.ones((L, S), bool))
        kw["attn_mask"], tkw["attn_mask"] = mdn.tensor(m, device=device), torch.tensor(m)
    if case == "float_mask":
        m = rng.standard_normal((L, S))
        kw["attn_mask"], tkw["attn_mask"] = mdn.tensor(m, device=device), torch.tensor(m)
    if case == "causal":
        kw["is_causal"] = tkw["is_causal"] = True
    if case == "scale":
        kw["scale"] = tkw["scale"] = 0.37
    if case == "gqa":
        kw["enable_gqa"] = tkw["enable_gqa"] = True
    y = F.scaled_dot_product_attention(q, k, v, **kw)
    ty = TF.scaled_dot_product_attention(tq, tk, tv, **tkw)
    _close(y, ty)
    g = np.random.default_rng(9).standard_normal(tuple(ty.shape))
    y.backward(mdn.tensor(g, device=device))
    ty.backward(torch.tensor(g))
    for a, t in ((q, tq), (k, tk), (v, tv)):
        _close(a.grad, t.grad)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_fully_masked_rows_are_zero_as_in_pytorch(kind):
    (q, tq), (k, tk), (v, tv) = (_pair(s, "cpu", i) for i, s in enumerate([(2, 3, 4), (2, 5, 4), (2, 5, 4)]))
    m = np.ones((3, 5), bool)
    m[1] = False
    if kind == "float":
        m = np.where(m, 0.0, -np.inf)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mdn.tensor(m))
    ty = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(m))
    _close(y, ty)
    y.sum().backward()
    ty.sum().backward()
    for a, t in ((q, tq), (k, tk), (v, tv)):
        _close(a.grad, t.grad)
    assert np.isfinite(q.grad.numpy()).all()


def test_sdpa_float_mask_gets_a_gradient():
    (q, tq), (k, tk), (v, tv), (m, tm) = (_pair(s, "cpu", i) for i, s in
                                          enumerate([(2, 3, 4), (2, 5, 4), (2, 5, 4), (3, 5)]))
    F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum().backward()
    TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm).sum().backward()
    _close(m.grad, tm.grad)


def test_sdpa_dropout_statistics():
    """dropout_p scales kept weights by 1/(1-p): with v = ones, each output row is the kept fraction / (1-p)."""
    mdn.manual_seed(0)
    q = mdn.zeros(1, 1, 4000, 2)
    v = mdn.ones(1, 1, 50, 1)
    y = F.scaled_dot_product_attention(q, mdn.zeros(1, 1, 50, 2), v, dropout_p=0.5).numpy()
    assert abs(y.mean() - 1.0) < 0.02 and set(np.unique(np.round(y * 25))).issubset(set(range(51)))


def test_sdpa_errors():
    q = mdn.zeros(2, 3, 4)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q, q, attn_mask=mdn.zeros(3, 3), is_causal=True)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, mdn.zeros(2, 3, 5), q)


def _copy_mha(m, t):
    sd = {k: v.detach().numpy().copy() for k, v in t.state_dict().items()}
    m.load_state_dict({k: mdn.tensor(v) for k, v in sd.items()})


MHA_CASES = {
    "default": dict(ctor={}, fwd={}),
    "batch_first": dict(ctor=dict(batch_first=True), fwd={}),
    "per_head_weights": dict(ctor={}, fwd=dict(average_attn_weights=False)),
    "no_weights": dict(ctor={}, fwd=dict(need_weights=False)),
    "kdim_vdim": dict(ctor=dict(kdim=5, vdim=3), fwd={}),
    "no_bias": dict(ctor=dict(bias=False), fwd={}),
    "bias_kv_zero_attn": dict(ctor=dict(add_bias_kv=True, add_zero_attn=True), fwd={}),
    "key_padding": dict(ctor={}, fwd=dict(key_padding_mask="bool")),
    "key_padding_float": dict(ctor={}, fwd=dict(key_padding_mask="float")),
    "attn_mask_bool": dict(ctor={}, fwd=dict(attn_mask="bool2d")),
    "attn_mask_3d_and_padding": dict(ctor=dict(batch_first=True), fwd=dict(attn_mask="float3d",
                                                                              key_padding_mask="bool")),
    "causal_no_weights": dict(ctor={}, fwd=dict(attn_mask="causal", is_causal=True, need_weights=False)),
    "padding_no_weights": dict(ctor=dict(add_zero_attn=True), fwd=dict(key_padding_mask="bool",
                                                                        need_weights=False)),
    "all_keys_padded_no_weights": dict(ctor={}, fwd=dict(key_padding_mask="all_bool", need_weights=False)),
    "unbatched": dict(ctor={}, fwd={}, unbatched=True),
}


@pytest.mark.parametrize("name", sorted(MHA_CASES))
def test_multihead_attention_matches_pytorch(name, device):
    case = MHA_CASES[name]
    E, H, L, S, N = 8, 2, 4, 6, 3
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(E, H, dtype=torch.float64, **case["ctor"])
    m = nn.MultiheadAttention(E, H, dtype=np.float64, **case["ctor"])
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    _copy_mha(m, t)
    m.to(device)
    kd, vd = case["ctor"].get("kdim", E), case["ctor"].get("vdim", E)
    bf = case["ctor"].get("batch_first", False)
    lead = (lambda n_: (N, n_)) if bf else (lambda n_: (n_, N))
    if case.get("unbatched"):
        def lead(n_):
            return (n_,)
    (q, tq), (k, tk), (v, tv) = (_pair(lead(L) + (E,), device, 0), _pair(lead(S) + (kd,), device, 1),
                                 _pair(lead(S) + (vd,), device, 2))
    fwd, tfwd = {}, {}
    rng = np.random.default_rng(4)
    for key_, kind in case["fwd"].items():
        if kind == "bool":
            a = rng.random((N, S)) > 0.6
            a[:, 0] = False
        elif kind == "all_bool":                  # batch element 1 has no key at all: PyTorch's output is 0
            a = rng.random((N, S)) > 0.6
            a[:, 0] = False
            a[1] = True
        elif kind == "float":
            a = rng.standard_normal((N, S))
        elif kind == "bool2d":
            a = rng.random((L, S)) > 0.6
            a[:, 1] = False
        elif kind == "float3d":
            a = rng.standard_normal((N * H, L, S))
        elif kind == "causal":
            a = ~np.tril(np.ones((L, S), bool))
        else:
            fwd[key_] = tfwd[key_] = kind
            continue
        fwd[key_], tfwd[key_] = mdn.tensor(a, device=device), torch.tensor(a)
    y, w = m(q, k, v, **fwd)
    ty, tw = t(tq, tk, tv, **tfwd)
    _close(y, ty)
    if tw is None:
        assert w is None
    else:
        _close(w, tw)
    g = np.random.default_rng(7).standard_normal(tuple(ty.shape))
    loss, tloss = (y * mdn.tensor(g, device=device)).sum(), (ty * torch.tensor(g)).sum()
    if w is not None:
        loss, tloss = loss + (w * w).sum(), tloss + (tw * tw).sum()
    loss.backward()
    tloss.backward()
    for a, ta in ((q, tq), (k, tk), (v, tv)):
        _close(a.grad, ta.grad)
    tparams = dict(t.named_parameters())
    for n_, p in m.named_parameters():
        _close(p.grad, tparams[n_].grad)


def test_multihead_attention_init_statistics():
    m = nn.MultiheadAttention(64, 4, add_bias_kv=True)
    w = m.in_proj_weight.numpy()
    bound = np.sqrt(6 / (64 + 192))                          # xavier_uniform over (3E, E)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert (m.in_proj_bias.numpy() == 0).all() and (m.out_proj.bias.numpy() == 0).all()
    assert m.bias_k.shape == (1, 1, 64)


def test_multihead_attention_dropout_only_in_training():
    m = nn.MultiheadAttention(8, 2, dropout=0.5)
    x = mdn.randn(3, 2, 8)
    m.eval()
    a, _ = m(x, x, x)
    b, _ = m(x, x, x)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    m.train()
    mdn.manual_seed(1)
    c, w = m(x, x, x, average_attn_weights=False)
    assert (w.numpy() == 0).any()


def test_multihead_attention_errors():
    m = nn.MultiheadAttention(8, 2)
    x = mdn.zeros(3, 2, 8)
    with pytest.raises(RuntimeError, match="attn_mask"):
        m(x, x, x, attn_mask=mdn.zeros(4, 4))
    with pytest.raises(RuntimeError, match="is_causal"):
        m(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="embedding dimension"):
        m(mdn.zeros(3, 2, 6), x, x)
    with pytest.raises(AssertionError):
        nn.MultiheadAttention(9, 2)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_float32_close_to_pytorch(need_weights):
    torch.manual_seed(3)
    t = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    m = nn.MultiheadAttention(16, 4, batch_first=True)
    _copy_mha(m, t)
    x = np.random.default_rng(0).standard_normal((2, 7, 16)).astype(np.float32)
    kpm = np.zeros((2, 7), bool)
    kpm[0, 5:] = True
    y, w = m(mdn.tensor(x), mdn.tensor(x), mdn.tensor(x), key_padding_mask=mdn.tensor(kpm), need_weights=need_weights)
    ty, tw = t(torch.tensor(x), torch.tensor(x), torch.tensor(x), key_padding_mask=torch.tensor(kpm),
               need_weights=need_weights)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1.3e-6, atol=1e-5)
    if need_weights:
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1.3e-6, atol=1e-5)


def test_sdpa_second_derivative():
    """The attention softmax is the one Softmax Function, whose gradient is differentiable again: a gradient
    penalty through attention works and matches finite differences."""
    rng = np.random.default_rng(5)
    q, k, v = (mdn.tensor(rng.standard_normal(s), dtype=mdn.float64, requires_grad=True)
               for s in [(2, 3, 4), (2, 5, 4), (2, 5, 4)])
    assert mdn.autograd.gradgradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), (q, k, v))

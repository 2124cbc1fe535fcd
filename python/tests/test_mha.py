"""attn.MultiheadAttention against torch.nn.MultiheadAttention (float64, eval,
dropout 0) with the same parameters copied in."""
import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
from _oracle import check_close, rand


def torch_twin(mha):
    """torch.nn.MultiheadAttention in float64 holding mha's parameters."""
    t = torch.nn.MultiheadAttention(
        mha.embed_dim, mha.num_heads, dropout=0.0, bias=mha.bias,
        kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first).double()
    t.load_state_dict({k: torch.from_numpy(v.astype(np.float64))
                       for k, v in mha.state_dict().items()}, strict=True)
    t.eval()
    return t


def _t(x):
    if x is None:
        return None
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return torch.from_numpy(x.copy())
    return torch.from_numpy(x.astype(np.float64))


def run_both(mha, q, k, v, label, self_attn=False, torch_kw=None, **kw):
    """Call ours and torch with the same arguments (torch_kw overrides torch's
    masks); compare out and weights. Returns (out, weights, ref_out)."""
    out, w = mha(q, k, v, **kw)
    tm = torch_twin(mha)
    tkw = dict(kw)
    tkw.pop("is_causal", None)
    for name in ("key_padding_mask", "attn_mask"):
        if name in tkw:
            tkw[name] = _t(tkw[name])
    tkw.update(torch_kw or {})
    tq = _t(q)
    tk = tq if self_attn else _t(k)
    tv = tq if self_attn else _t(v)
    assert torch.is_grad_enabled()  # keeps torch off its fast path
    ref_out, ref_w = tm(tq, tk, tv, **tkw)
    ref_out = ref_out.detach().numpy()
    check_close("mha/%s/out" % label, out, ref_out, nan_means_zero=False)
    if kw.get("need_weights", True):
        check_close("mha/%s/weights" % label, w, ref_w.detach().numpy())
    else:
        assert w is None and ref_w is None
    return out, w, ref_out


# ------------------------------------------------------------------ layouts

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_self_attention(bias, batch_first, average):
    rng = np.random.default_rng(1 + 2 * bias + 4 * batch_first)
    E, H, B, L = 16, 4, 3, 7
    mha = attn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first, seed=5)
    if bias:  # non-zero biases, so they are exercised
        mha.in_proj_bias = rand(rng, 3 * E, scale=0.5)
        mha.out_proj_bias = rand(rng, E, scale=0.5)
    x = rand(rng, B, L, E) if batch_first else rand(rng, L, B, E)
    out, w, _ = run_both(mha, x, x, x, "self", self_attn=True,
                         average_attn_weights=average)
    assert out.shape == x.shape
    assert w.shape == ((B, L, L) if average else (B, H, L, L))


@pytest.mark.parametrize("kdim,vdim", [(6, 10), (16, 5), (9, 16), (16, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_cross_attention(kdim, vdim, bias):
    rng = np.random.default_rng(kdim * 31 + vdim)
    E, H, B, Lq, Lk = 16, 2, 2, 5, 9
    mha = attn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, seed=2)
    if kdim == vdim == E:
        assert mha.in_proj_weight.shape == (3 * E, E) and mha.q_proj_weight is None
    else:
        assert mha.in_proj_weight is None
        assert mha.k_proj_weight.shape == (E, kdim)
        assert mha.v_proj_weight.shape == (E, vdim)
    if bias:
        mha.in_proj_bias = rand(rng, 3 * E)
        mha.out_proj.bias = rand(rng, E)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, kdim), rand(rng, B, Lk, vdim)
    for avg in (True, False):
        run_both(mha, q, k, v, "cross", average_attn_weights=avg)


@pytest.mark.parametrize("average", [True, False])
def test_unbatched(average):
    rng = np.random.default_rng(3)
    E, H, Lq, Lk = 12, 3, 4, 6
    mha = attn.MultiheadAttention(E, H, kdim=5, vdim=7, seed=9)
    q, k, v = rand(rng, Lq, E), rand(rng, Lk, 5), rand(rng, Lk, 7)
    kpm = np.array([False, False, True, False, True, False])
    am = rng.random((Lq, Lk)) < 0.2
    out, w, _ = run_both(mha, q, k, v, "unbatched", key_padding_mask=kpm,
                         attn_mask=am, average_attn_weights=average)
    assert out.shape == (Lq, E)
    assert w.shape == ((Lq, Lk) if average else (H, Lq, Lk))
    am3 = rand(rng, H, Lq, Lk)  # per-head float mask, [H, Lq, Lk] unbatched
    run_both(mha, q, k, v, "unbatched", attn_mask=am3, average_attn_weights=average)
    # unbatched self-attention
    mha2 = attn.MultiheadAttention(E, H, seed=1)
    x = rand(rng, Lq, E)
    run_both(mha2, x, x, x, "unbatched", self_attn=True)


def test_need_weights_false():
    rng = np.random.default_rng(4)
    mha = attn.MultiheadAttention(8, 2, seed=4)
    x = rand(rng, 2, 5, 8)
    out, w, _ = run_both(mha, x, x, x, "no_weights", self_attn=True, need_weights=False)
    assert w is None


def test_query_is_key_is_value_same_as_copies():
    rng = np.random.default_rng(5)
    mha = attn.MultiheadAttention(8, 2, seed=4)
    x = rand(rng, 2, 5, 8)
    a, wa = mha(x, x, x)
    b, wb = mha(x.copy(), x.copy(), x.copy())
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(wa, wb)


# ------------------------------------------------------------------ masks

@pytest.mark.parametrize("batch_first", [True, False])
def test_key_padding_mask_bool(batch_first):
    rng = np.random.default_rng(6)
    E, H, B, Lq, Lk = 16, 4, 3, 5, 8
    mha = attn.MultiheadAttention(E, H, batch_first=batch_first, seed=6)
    mha.in_proj_bias = rand(rng, 3 * E)
    shape = (lambda L, D: (B, L, D)) if batch_first else (lambda L, D: (L, B, D))
    q, k, v = rand(rng, *shape(Lq, E)), rand(rng, *shape(Lk, E)), rand(rng, *shape(Lk, E))
    # a suffix pattern (goes to key lengths) ...
    kpm = np.zeros((B, Lk), bool)
    kpm[0, 5:] = True
    kpm[2, 1:] = True
    run_both(mha, q, k, v, "kpm_bool", key_padding_mask=kpm)
    # ... and an arbitrary one (goes to a bool mask)
    kpm2 = rng.random((B, Lk)) < 0.4
    kpm2[:, 0] = False
    run_both(mha, q, k, v, "kpm_bool", key_padding_mask=kpm2,
             average_attn_weights=False)
    # both kinds with an attention mask
    am = np.triu(np.ones((Lq, Lk), bool), k=Lk - Lq + 1)
    run_both(mha, q, k, v, "kpm_bool+attn_mask", key_padding_mask=kpm, attn_mask=am)
    run_both(mha, q, k, v, "kpm_bool+attn_mask", key_padding_mask=kpm2, attn_mask=am)


def test_key_padding_mask_float():
    rng = np.random.default_rng(7)
    E, H, B, L = 8, 2, 2, 6
    mha = attn.MultiheadAttention(E, H, seed=7)
    x = rand(rng, B, L, E)
    kpm = rand(rng, B, L)
    kpm[1, 3] = -np.inf
    run_both(mha, x, x, x, "kpm_float", self_attn=True, key_padding_mask=kpm)


def test_attn_mask_bool_causal():
    rng = np.random.default_rng(8)
    E, H, B, L = 16, 4, 2, 9
    mha = attn.MultiheadAttention(E, H, seed=8)
    x = rand(rng, B, L, E)
    causal = np.triu(np.ones((L, L), bool), k=1)  # True = NOT allowed (torch)
    out, _, _ = run_both(mha, x, x, x, "attn_mask_bool", self_attn=True,
                         attn_mask=causal)
    # is_causal gives the same thing without a mask
    out2, _ = mha(x, x, x, is_causal=True)
    np.testing.assert_allclose(out2, out, rtol=1e-6, atol=1e-6)
    run_both(mha, x, x, x, "is_causal", self_attn=True, is_causal=True,
             torch_kw={"attn_mask": _t(causal)}, average_attn_weights=False)


def test_is_causal_cross_bottom_right():
    rng = np.random.default_rng(81)
    E, H, B, Lq, Lk = 8, 2, 2, 3, 7
    mha = attn.MultiheadAttention(E, H, seed=8)
    q, kv = rand(rng, B, Lq, E), rand(rng, B, Lk, E)
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    not_allowed = j > i + Lk - Lq
    run_both(mha, q, kv, kv, "is_causal", is_causal=True,
             torch_kw={"attn_mask": _t(not_allowed)})


def test_attn_mask_float_and_per_head():
    rng = np.random.default_rng(9)
    E, H, B, Lq, Lk = 12, 3, 2, 4, 6
    mha = attn.MultiheadAttention(E, H, kdim=7, vdim=7, seed=9)
    q, k = rand(rng, B, Lq, E), rand(rng, B, Lk, 7)
    fm = rand(rng, Lq, Lk)
    run_both(mha, q, k, k, "attn_mask_float", attn_mask=fm)
    fm3 = rand(rng, B * H, Lq, Lk)
    fm3[1, 2, :3] = -np.inf
    run_both(mha, q, k, k, "attn_mask_float", attn_mask=fm3,
             average_attn_weights=False)
    bm3 = rng.random((B * H, Lq, Lk)) < 0.3
    run_both(mha, q, k, k, "attn_mask_bool", attn_mask=bm3,
             average_attn_weights=False)


def test_combined_float_masks():
    # float key_padding_mask + float attn_mask add up (torch 2 semantics);
    # torch 1.13 cannot take both, so its oracle gets the sum.
    rng = np.random.default_rng(10)
    E, H, B, Lq, Lk = 8, 2, 2, 3, 5
    mha = attn.MultiheadAttention(E, H, seed=10)
    q, k = rand(rng, B, Lq, E), rand(rng, B, Lk, E)
    kpm, am = rand(rng, B, Lk), rand(rng, Lq, Lk)
    total = (am[None, None] + kpm[:, None, None, :]).repeat(H, 1).reshape(B * H, Lq, Lk)
    run_both(mha, q, k, k, "combined", key_padding_mask=kpm, attn_mask=am,
             torch_kw={"key_padding_mask": None, "attn_mask": _t(total)})
    # bool kpm + float attn_mask (torch 1.13 handles this one itself)
    kpm_b = np.zeros((B, Lk), bool)
    kpm_b[0, 2] = True
    run_both(mha, q, k, k, "combined", key_padding_mask=kpm_b, attn_mask=am)
    # float kpm + bool attn_mask
    amb = rng.random((Lq, Lk)) < 0.3
    total2 = np.where(amb[None, None], -np.inf, 0.0) + kpm[:, None, None, :]
    total2 = np.broadcast_to(total2, (B, H, Lq, Lk)).reshape(B * H, Lq, Lk)
    run_both(mha, q, k, k, "combined", key_padding_mask=kpm, attn_mask=amb,
             torch_kw={"key_padding_mask": None, "attn_mask": _t(total2)})


def test_fully_masked_rows():
    # torch gives NaN; ours gives attention 0, so out = out_proj bias
    rng = np.random.default_rng(11)
    E, H, B, L = 8, 2, 2, 5
    mha = attn.MultiheadAttention(E, H, seed=11)
    mha.out_proj_bias = rand(rng, E)
    x = rand(rng, B, L, E)
    kpm = np.zeros((B, L), bool)
    kpm[1] = True
    out, w, ref = run_both(mha, x, x, x, "fully_masked", self_attn=True,
                           key_padding_mask=kpm)
    assert np.all(np.isnan(ref[1]))
    np.testing.assert_allclose(out[1], np.broadcast_to(mha.out_proj_bias, (L, E)),
                               rtol=1e-6, atol=1e-6)
    assert np.all(w[1] == 0)


# ------------------------------------------------------------------ parameters

def test_init_like_torch():
    E, H = 32, 4
    mha = attn.MultiheadAttention(E, H, seed=123)
    bound = math.sqrt(6.0 / (E + 3 * E))  # xavier_uniform over [3E, E]
    w = mha.in_proj_weight
    assert np.all(np.abs(w) <= bound) and w.std() > 0.4 * bound
    assert np.all(np.abs(mha.out_proj_weight) <= 1 / math.sqrt(E))
    assert np.all(mha.in_proj_bias == 0) and np.all(mha.out_proj_bias == 0)
    again = attn.MultiheadAttention(E, H, seed=123)
    np.testing.assert_array_equal(again.parameters_buffer, mha.parameters_buffer)
    other = attn.MultiheadAttention(E, H, seed=124)
    assert not np.array_equal(other.parameters_buffer, mha.parameters_buffer)
    # separate projections: xavier over each [E, kdim]
    m2 = attn.MultiheadAttention(E, H, kdim=8, vdim=64, seed=1)
    assert np.all(np.abs(m2.k_proj_weight) <= math.sqrt(6.0 / (E + 8)))
    assert np.all(np.abs(m2.v_proj_weight) <= math.sqrt(6.0 / (E + 64)))


@pytest.mark.parametrize("kdim,vdim,bias", [(None, None, True), (5, 7, True),
                                            (None, None, False), (5, 7, False)])
def test_packed_buffer_order(kdim, vdim, bias):
    # w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o, as attn.h documents
    E = 8
    mha = attn.MultiheadAttention(E, 2, bias=bias, kdim=kdim, vdim=vdim)
    kd, vd = kdim or E, vdim or E
    buf = mha.parameters_buffer
    n = E * E + E * kd + E * vd + E * E + (4 * E if bias else 0)
    assert buf.shape == (n,) and buf.dtype == np.float32
    if kdim is None:
        parts = [mha.in_proj_weight]
    else:
        parts = [mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight]
    if bias:
        parts.append(mha.in_proj_bias)
    parts.append(mha.out_proj_weight)
    if bias:
        parts.append(mha.out_proj_bias)
    np.testing.assert_array_equal(np.concatenate([p.ravel() for p in parts]), buf)
    for p in parts:
        assert np.shares_memory(p, buf)


def test_parameter_assignment():
    mha = attn.MultiheadAttention(8, 2)
    w = np.arange(3 * 64, dtype=np.float64).reshape(24, 8)
    mha.in_proj_weight = w
    np.testing.assert_array_equal(mha.parameters_buffer[: 3 * 64], w.ravel())
    mha.out_proj.weight = np.eye(8)
    np.testing.assert_array_equal(mha.out_proj_weight, np.eye(8))
    mha.out_proj_bias = torch.ones(8, requires_grad=True)  # torch tensors too
    assert np.all(mha.out_proj_bias == 1)
    with pytest.raises(ValueError):
        mha.in_proj_weight = np.zeros((8, 24))
    with pytest.raises(ValueError):
        mha.out_proj_bias = np.zeros(9)
    with pytest.raises(ValueError):
        mha.q_proj_weight = np.zeros((8, 8))  # packed in_proj_weight here
    nb = attn.MultiheadAttention(8, 2, bias=False)
    assert nb.in_proj_bias is None and nb.out_proj_bias is None
    with pytest.raises(ValueError):
        nb.in_proj_bias = np.zeros(24)


def test_state_dict_round_trip_with_torch():
    t = torch.nn.MultiheadAttention(12, 3, kdim=4, vdim=6, batch_first=True)
    mha = attn.MultiheadAttention(12, 3, kdim=4, vdim=6)
    mha.load_state_dict(t.state_dict())
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(mha.state_dict()[k], v.numpy())
    with pytest.raises(ValueError):
        mha.load_state_dict({"in_proj_weight": np.zeros((36, 12))})


# ------------------------------------------------------------------ errors

def test_errors():
    with pytest.raises(ValueError, match="divisible"):
        attn.MultiheadAttention(10, 3)  # the library's message
    with pytest.raises(ValueError):
        attn.MultiheadAttention(0, 1)
    with pytest.raises(ValueError):
        attn.MultiheadAttention(8, 2, dropout=1.5)
    with pytest.raises(ValueError):
        attn.MultiheadAttention(8, 2, dropout=1.0)  # libattn: [0, 1)
    rng = np.random.default_rng(0)
    mha = attn.MultiheadAttention(8, 2, kdim=4, vdim=6)
    q, k, v = rand(rng, 2, 5, 8), rand(rng, 2, 7, 4), rand(rng, 2, 7, 6)
    mha(q, k, v)
    bad_calls = [
        (rand(rng, 2, 5, 7), k, v),        # query E
        (q, rand(rng, 2, 7, 6), v),         # key kdim
        (q, k, rand(rng, 2, 7, 4)),         # value vdim
        (q, k[:1], v[:1]),                  # batch size
        (q, k, v[:, :6]),                   # key/value length
        (q[0], k, v),                       # 2-D with 3-D
        (q[None], k[None], v[None]),        # 4-D
    ]
    for args in bad_calls:
        with pytest.raises(ValueError):
            mha(*args)
    for am in (np.zeros((5, 6), bool), np.zeros((3, 5, 7), np.float32),
               np.zeros((2, 5, 7), bool), np.zeros((5, 7), np.int64)):
        with pytest.raises(ValueError):
            mha(q, k, v, attn_mask=am)
    for kpm in (np.zeros((2, 6), bool), np.zeros((7,), bool), np.zeros((2, 7), np.int8)):
        with pytest.raises(ValueError):
            mha(q, k, v, key_padding_mask=kpm)


def test_dropout_layer():
    rng = np.random.default_rng(12)
    mha = attn.MultiheadAttention(8, 2, dropout=0.5, seed=3)
    x = rand(rng, 2, 6, 8)
    mha.eval()
    a, _ = mha(x, x, x)
    b, _ = mha(x, x, x)
    np.testing.assert_array_equal(a, b)  # eval: no dropout
    mha.train()
    c, _ = mha(x, x, x)
    if np.array_equal(a, c):
        pytest.skip("dropout not implemented by this libattn yet")
    d, _ = mha(x, x, x)
    assert not np.array_equal(c, d)  # each training call draws a new mask


def test_larger_layer():
    rng = np.random.default_rng(13)
    E, H, B, Lq, Lk = 64, 8, 2, 40, 56
    mha = attn.MultiheadAttention(E, H, kdim=48, vdim=32, seed=13)
    mha.in_proj_bias = rand(rng, 3 * E)
    mha.out_proj_bias = rand(rng, E)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, 48), rand(rng, B, Lk, 32)
    kpm = np.zeros((B, Lk), bool)
    kpm[1, 30:] = True
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    run_both(mha, q, k, v, "larger", key_padding_mask=kpm,
             attn_mask=j > i + Lk - Lq, average_attn_weights=False)

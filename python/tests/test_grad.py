"""Gradients: attn.scaled_dot_product_attention_grad and
MultiheadAttention.backward against PyTorch 1.13 autograd in float64, and the
dropout's determinism and statistics.

Oracles: PyTorch's math path (matmul, masked_fill, softmax, matmul) with the
rows that see no key given weights 0 instead of NaN (_oracle.safe_attention),
and torch.nn.MultiheadAttention holding the same parameters. Dropout masks
are read back from the library (_oracle.dropout_multipliers) and applied in
the oracle, so the dropout gradients are checked against autograd too.
"""
import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
from _oracle import (check_close, check_grad, dropout_multipliers,
                     philox4x32_10, philox_keep, rand, record_stat,
                     structural_keep, torch_mha_functional, torch_sdpa_grad)


# ================================================================== SDPA

def sdpa_case(case, rng, q, k, v, keep=None, add=None, scale=None, drop=None,
              **kw):
    """Ours (output and dq, dk, dv) vs the float64 autograd oracle for one
    call. kw are attn's keyword arguments (attn_mask, is_causal,
    key_padding_lengths, window, dropout_p, seed, offset, impl); keep / add /
    drop describe the same masks and dropout to the oracle."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    g = rand(rng, *(q.shape[:-1] + (v.shape[-1],)))
    dq, dk, dv = attn.scaled_dot_product_attention_grad(g, q, k, v,
                                                        scale=scale, **kw)
    out = attn.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    ref_out, rdq, rdk, rdv = torch_sdpa_grad(q, k, v, g, keep=keep, add=add,
                                             scale=scale, drop=drop)
    for a, x in ((dq, q), (dk, k), (dv, v)):
        assert a.shape == x.shape and a.dtype == np.float32
    check_close("sdpa/grad-%s/out" % case, out, ref_out, nan_means_zero=False)
    check_grad("sdpa", case, "dq", dq, rdq)
    check_grad("sdpa", case, "dk", dk, rdk)
    check_grad("sdpa", case, "dv", dv, rdv)
    return dq, dk, dv, g


def empty_rows(keep_total):
    """bool [..., Lq]: rows where no key takes part."""
    return ~np.asarray(keep_total).any(axis=-1)


SHAPES = [
    # lead, Lq, Lk, Dk, Dv
    ((), 5, 5, 8, 8),
    ((3,), 1, 7, 8, 8),
    ((3,), 7, 1, 8, 3),
    ((2, 3), 5, 9, 16, 4),
    ((2, 2, 3), 9, 5, 3, 5),
    ((2, 4), 33, 17, 64, 48),
]


@pytest.mark.parametrize("lead,Lq,Lk,Dk,Dv", SHAPES)
def test_sdpa_grad_shapes(lead, Lq, Lk, Dk, Dv):
    rng = np.random.default_rng(Lq * 1000 + Lk * 10 + Dv)
    q, k = rand(rng, *lead, Lq, Dk), rand(rng, *lead, Lk, Dk)
    v = rand(rng, *lead, Lk, Dv)
    sdpa_case("shapes", rng, q, k, v)


@pytest.mark.parametrize("seed", range(6))
def test_sdpa_grad_random(seed):
    rng = np.random.default_rng(2000 + seed)
    lead = tuple(int(x) for x in rng.integers(1, 4, size=int(rng.integers(0, 3))))
    Lq, Lk, Dk, Dv = (int(x) for x in rng.integers(1, 30, size=4))
    q = rand(rng, *lead, Lq, Dk, scale=1.5)
    k, v = rand(rng, *lead, Lk, Dk), rand(rng, *lead, Lk, Dv)
    sdpa_case("random", rng, q, k, v)


def test_sdpa_grad_large_scores():
    rng = np.random.default_rng(7)
    q = rand(rng, 2, 2, 8, 16, scale=6.0)
    k, v = rand(rng, 2, 2, 12, 16, scale=6.0), rand(rng, 2, 2, 12, 16)
    sdpa_case("large_scores", rng, q, k, v)


@pytest.mark.parametrize("Lq,Lk", [(6, 6), (3, 8), (1, 5), (8, 3)])
def test_sdpa_grad_causal(Lq, Lk):
    rng = np.random.default_rng(Lq * 100 + Lk)
    lead = (2, 2)
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 6)
    keep = structural_keep(lead, Lq, Lk, causal=True)  # bottom-right
    dq, _, _, _ = sdpa_case("causal", rng, q, k, v, keep=keep, is_causal=True)
    if Lq > Lk:  # the first Lq - Lk queries see no key: zero gradient
        assert np.all(dq[..., : Lq - Lk, :] == 0)


def test_sdpa_grad_key_padding():
    rng = np.random.default_rng(31)
    lead, Lq, Lk = (4, 2), 5, 9
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 5)
    lengths = [9, 4, 0, 1]  # batch 2 sees no key at all
    keep = structural_keep(lead, Lq, Lk, key_lengths=lengths)
    dq, dk, dv, _ = sdpa_case("key_padding", rng, q, k, v, keep=keep,
                              key_padding_lengths=lengths)
    assert np.all(dq[2] == 0) and np.all(dk[2] == 0) and np.all(dv[2] == 0)
    assert np.all(dk[1, :, 4:] == 0) and np.all(dv[1, :, 4:] == 0)


@pytest.mark.parametrize("window,causal,Lq,Lk", [
    ((2, 1), False, 7, 7), ((0, 0), False, 6, 6), ((3, None), True, 5, 9),
    ((None, 2), False, 8, 4), ((1, 1), True, 9, 4)])
def test_sdpa_grad_window(window, causal, Lq, Lk):
    rng = np.random.default_rng(Lq * 7 + Lk)
    lead = (2, 3)
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 4)
    keep = structural_keep(lead, Lq, Lk, causal=causal, window=window)
    dq, _, _, _ = sdpa_case("window", rng, q, k, v, keep=keep, window=window,
                            is_causal=causal)
    rows = empty_rows(keep)
    assert np.all(dq[rows] == 0)


@pytest.mark.parametrize("mshape", [(6, 9), (2, 1, 6, 9), (1, 3, 6, 9), (2, 3, 6, 9)])
def test_sdpa_grad_bool_mask(mshape):
    rng = np.random.default_rng(len(mshape) * 10 + mshape[0])
    lead, Lq, Lk = (2, 3), 6, 9
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 7)
    m = rng.random(mshape) < 0.6
    m[..., 1, :] = False  # a row that sees no key
    dq, _, _, _ = sdpa_case("bool_mask", rng, q, k, v, keep=m, attn_mask=m)
    assert np.all(dq[..., 1, :] == 0)


def test_sdpa_grad_float_mask():
    rng = np.random.default_rng(41)
    lead, Lq, Lk = (2, 3), 6, 9
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 8)
    fm = rand(rng, 3, Lq, Lk, scale=2.0)
    fm[0, 2, :4] = -np.inf
    fm[1, 3, :] = -np.inf  # a row that sees no key
    dq, _, _, _ = sdpa_case("float_mask", rng, q, k, v, add=fm, attn_mask=fm)
    assert np.all(dq[:, 1, 3] == 0)
    # float64 masks are accepted (converted)
    sdpa_case("float_mask", rng, q, k, v, add=fm, attn_mask=fm.astype(np.float64))


@pytest.mark.parametrize("seed", range(4))
def test_sdpa_grad_combined(seed):
    rng = np.random.default_rng(300 + seed)
    lead, Lq, Lk = (3, 2), int(rng.integers(3, 12)), int(rng.integers(3, 12))
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 6)
    lengths = [int(x) for x in rng.integers(0, Lk + 1, size=3)]
    window = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
    bm = rng.random((Lq, Lk)) < 0.8
    keep = structural_keep(lead, Lq, Lk, causal=True, key_lengths=lengths,
                           window=window) & bm
    fm = rand(rng, 2, Lq, Lk)
    # a float mask and a bool mask together go through the add mask here
    add = fm + np.where(bm, 0.0, -np.inf).astype(np.float32)
    dq, _, _, _ = sdpa_case("combined", rng, q, k, v, keep=keep, add=fm,
                            attn_mask=add.astype(np.float32), is_causal=True,
                            key_padding_lengths=lengths, window=window)
    assert np.all(dq[empty_rows(keep)] == 0)
    # the bool mask as the mask, the float one folded in by the oracle only
    # (no float mask): causal + lengths + window + bool
    sdpa_case("combined", rng, q, k, v, keep=keep, attn_mask=bm,
              is_causal=True, key_padding_lengths=lengths, window=window)


@pytest.mark.parametrize("scale", [0.3, -0.5, 2.0, 0.0])
def test_sdpa_grad_scale(scale):
    rng = np.random.default_rng(51)
    q, k = rand(rng, 2, 3, 6, 8), rand(rng, 2, 3, 7, 8)
    v = rand(rng, 2, 3, 7, 5)
    dq, dk, _, _ = sdpa_case("scale", rng, q, k, v, scale=scale)
    if scale == 0.0:  # scores do not depend on q or k
        assert np.all(dq == 0) and np.all(dk == 0)


def test_sdpa_grad_strided_dtypes_torch():
    rng = np.random.default_rng(61)
    base = rand(rng, 2, 8, 3, 16)  # [B, L, H, D]: a transposed view
    q = base[..., :8].transpose(0, 2, 1, 3)
    k = rand(rng, 2, 3, 10, 8).astype(np.float64)
    v = rand(rng, 2, 10, 3, 6).transpose(0, 2, 1, 3)
    dq, dk, dv, g = sdpa_case("strided", rng, q, k, v, is_causal=True,
                              keep=structural_keep((2, 3), 8, 10, causal=True))
    # torch tensors (with requires_grad) and a strided grad_out
    gs = np.asfortranarray(g)
    tq = torch.from_numpy(np.ascontiguousarray(q)).requires_grad_(True)
    a = attn.scaled_dot_product_attention_grad(gs, tq, torch.from_numpy(k), v,
                                               is_causal=True)
    for x, y in zip(a, (dq, dk, dv)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_sdpa_grad_each_path(impl):
    rng = np.random.default_rng(72)
    lead, Lq, Lk = (2, 3), 33, 70
    q, k = rand(rng, *lead, Lq, 32), rand(rng, *lead, Lk, 32)
    v = rand(rng, *lead, Lk, 24)
    lengths = [50, 70]
    keep = structural_keep(lead, Lq, Lk, causal=True, key_lengths=lengths)
    fm = rand(rng, Lq, Lk)
    sdpa_case("impl_" + impl, rng, q, k, v, keep=keep, add=fm, attn_mask=fm,
              is_causal=True, key_padding_lengths=lengths, impl=impl)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_sdpa_grad_dropout_vs_autograd(p):
    # the library's mask, read back, applied in the oracle
    rng = np.random.default_rng(int(p * 100))
    lead, Lq, Lk = (2, 3), 7, 11
    q, k = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8)
    v = rand(rng, *lead, Lk, 5)
    lengths = [11, 6]
    keep = structural_keep(lead, Lq, Lk, causal=True, key_lengths=lengths)
    for seed, offset in ((3, 0), (3, 1), (2**63 + 5, 7)):
        drop = dropout_multipliers(lead, Lq, Lk, p, seed, offset)
        sdpa_case("dropout", rng, q, k, v, keep=keep, drop=drop,
                  is_causal=True, key_padding_lengths=lengths, dropout_p=p,
                  seed=seed, offset=offset)


def test_sdpa_grad_empty():
    q, k, v = (np.zeros((0, 3, 5, 8), np.float32), np.zeros((0, 3, 6, 8), np.float32),
               np.zeros((0, 3, 6, 4), np.float32))
    dq, dk, dv = attn.scaled_dot_product_attention_grad(
        np.zeros((0, 3, 5, 4), np.float32), q, k, v)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_sdpa_grad_errors():
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 2, 3, 5, 8), rand(rng, 2, 3, 6, 8), rand(rng, 2, 3, 6, 4)
    g = rand(rng, 2, 3, 5, 4)
    for bad in (g[..., :3], g[:1], g[0], np.zeros(g.shape, bool).astype(object)):
        with pytest.raises(ValueError):
            attn.scaled_dot_product_attention_grad(bad, q, k, v)
    with pytest.raises(ValueError):  # d_k mismatch: the library's message
        attn.scaled_dot_product_attention_grad(g, q, k[..., :4], v)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention_grad(g, q, k, v, key_padding_lengths=[7, 1])
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention_grad(g, q, k, v, attn_mask=np.ones((4, 6), bool))


# ================================================================== MHA

OUR_TO_TORCH = {"in_proj_weight": "in_proj_weight", "q_proj_weight": "q_proj_weight",
                "k_proj_weight": "k_proj_weight", "v_proj_weight": "v_proj_weight",
                "in_proj_bias": "in_proj_bias", "out_proj_weight": "out_proj.weight",
                "out_proj_bias": "out_proj.bias"}


def torch_twin(mha):
    """torch.nn.MultiheadAttention in float64 holding mha's parameters."""
    t = torch.nn.MultiheadAttention(
        mha.embed_dim, mha.num_heads, dropout=0.0, bias=mha.bias,
        kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first).double()
    t.load_state_dict({k: torch.from_numpy(v.astype(np.float64))
                       for k, v in mha.state_dict().items()}, strict=True)
    return t


def _t(x, requires_grad=False):
    if x is None:
        return None
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return torch.from_numpy(x.copy())
    t = torch.from_numpy(x.astype(np.float64))
    return t.requires_grad_(True) if requires_grad else t


def _our_params(mha):
    return {n: getattr(mha, n) for n in OUR_TO_TORCH if getattr(mha, n) is not None}


def mha_case(mha, case, rng, q, k, v, self_attn=False, kv_same=False,
             torch_kw=None, functional=None, **kw):
    """Forward + backward of ours and of the oracle with the same upstream
    gradient; compares out, d_query, d_key, d_value and every parameter
    gradient. The oracle is torch.nn.MultiheadAttention (torch_kw override
    its masks), or, with functional=dict(keep=, add=, drop=) (batch-first
    [B, H, Lq, Lk] broadcastable), _oracle.torch_mha_functional."""
    out, _ = mha(q, k, v, **kw)
    g = rand(rng, *out.shape)
    d = mha.backward(g)

    X = _t(q, True)
    K = X if self_attn else _t(k, True)
    V = X if self_attn else (K if kv_same else _t(v, True))
    if functional is None:
        tm = torch_twin(mha)
        tkw = {n: _t(kw[n]) for n in ("key_padding_mask", "attn_mask") if n in kw}
        tkw.update(torch_kw or {})
        assert torch.is_grad_enabled()
        ref_out, _ = tm(X, K, V, need_weights=False, **tkw)
        tparams = dict(tm.named_parameters())
        params = {n: tparams[OUR_TO_TORCH[n]] for n in _our_params(mha)}
    else:
        params = {n: _t(a, True) for n, a in _our_params(mha).items()}

        def bf(t):  # caller's layout -> batch-first (differentiable)
            if t.dim() == 2:
                return t.unsqueeze(0)
            return t if mha.batch_first else t.transpose(0, 1)
        ref_out = torch_mha_functional(params, mha.embed_dim, mha.num_heads,
                                       bf(X), bf(K), bf(V), **functional)
        if X.dim() == 2:
            ref_out = ref_out[0]
        elif not mha.batch_first:
            ref_out = ref_out.transpose(0, 1)
    ref_out.backward(_t(g))
    check_close("mha/grad-%s/out" % case, out, ref_out.detach().numpy(),
                nan_means_zero=False)

    dq, dk, dv = d
    assert dq.shape == np.shape(q) and dk.shape == np.shape(k) and dv.shape == np.shape(v)
    if self_attn:
        assert dq is dk and dk is dv  # the gradient of the one input, summed
    if kv_same:
        assert dk is dv
    check_grad("mha", case, "d_query", dq, X.grad.numpy())
    check_grad("mha", case, "d_key", dk, K.grad.numpy())
    check_grad("mha", case, "d_value", dv, V.grad.numpy())
    assert set(mha.grads) == set(_our_params(mha))
    for n, a in mha.grads.items():
        assert a.shape == getattr(mha, n).shape
        check_grad("mha", case, n, a, params[n].grad.numpy())
    return out, d, g


def _with_biases(mha, rng):
    if mha.bias:
        mha.in_proj_bias = rand(rng, 3 * mha.embed_dim, scale=0.5)
        mha.out_proj_bias = rand(rng, mha.embed_dim, scale=0.5)
    return mha


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_grad_self(bias, batch_first):
    rng = np.random.default_rng(1 + 2 * bias + 4 * batch_first)
    E, H, B, L = 16, 4, 3, 7
    mha = _with_biases(attn.MultiheadAttention(E, H, bias=bias,
                                               batch_first=batch_first, seed=5), rng)
    x = rand(rng, B, L, E) if batch_first else rand(rng, L, B, E)
    mha_case(mha, "self", rng, x, x, x, self_attn=True)


@pytest.mark.parametrize("kdim,vdim", [(6, 10), (16, 5), (16, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_grad_cross(kdim, vdim, bias):
    rng = np.random.default_rng(kdim * 31 + vdim + bias)
    E, H, B, Lq, Lk = 16, 2, 2, 5, 9
    mha = _with_biases(attn.MultiheadAttention(E, H, bias=bias, kdim=kdim,
                                               vdim=vdim, seed=2), rng)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, kdim), rand(rng, B, Lk, vdim)
    mha_case(mha, "cross", rng, q, k, v)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_grad_cross_key_is_value(batch_first):
    rng = np.random.default_rng(17 + batch_first)
    E, H, B, Lq, Lk = 12, 3, 2, 4, 6
    mha = _with_biases(attn.MultiheadAttention(E, H, kdim=7, vdim=7,
                                               batch_first=batch_first, seed=3), rng)
    q = rand(rng, B, Lq, E) if batch_first else rand(rng, Lq, B, E)
    mem = rand(rng, B, Lk, 7) if batch_first else rand(rng, Lk, B, 7)
    mha_case(mha, "cross_kv_same", rng, q, mem, mem, kv_same=True)


def test_mha_grad_unbatched():
    rng = np.random.default_rng(3)
    E, H, Lq, Lk = 12, 3, 4, 6
    mha = _with_biases(attn.MultiheadAttention(E, H, kdim=5, vdim=7, seed=9), rng)
    q, k, v = rand(rng, Lq, E), rand(rng, Lk, 5), rand(rng, Lk, 7)
    kpm = np.array([False, False, True, False, True, False])
    am = rng.random((Lq, Lk)) < 0.2
    am[:, 0] = False
    mha_case(mha, "unbatched", rng, q, k, v, key_padding_mask=kpm, attn_mask=am)
    am3 = rand(rng, H, Lq, Lk)  # per-head float mask
    mha_case(mha, "unbatched", rng, q, k, v, attn_mask=am3)
    mha2 = _with_biases(attn.MultiheadAttention(E, H, seed=1), rng)
    x = rand(rng, Lq, E)
    mha_case(mha2, "unbatched", rng, x, x, x, self_attn=True)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_grad_key_padding_mask(batch_first):
    rng = np.random.default_rng(6 + batch_first)
    E, H, B, Lq, Lk = 16, 4, 3, 5, 8
    mha = _with_biases(attn.MultiheadAttention(E, H, batch_first=batch_first,
                                               seed=6), rng)
    shape = (lambda L, D: (B, L, D)) if batch_first else (lambda L, D: (L, B, D))
    q, k, v = rand(rng, *shape(Lq, E)), rand(rng, *shape(Lk, E)), rand(rng, *shape(Lk, E))
    kpm = np.zeros((B, Lk), bool)  # suffix padding: the key-lengths path
    kpm[0, 5:] = True
    kpm[2, 1:] = True
    mha_case(mha, "kpm_bool", rng, q, k, v, key_padding_mask=kpm)
    kpm2 = rng.random((B, Lk)) < 0.4  # arbitrary: the bool-mask path
    kpm2[:, 0] = False
    mha_case(mha, "kpm_bool", rng, q, k, v, key_padding_mask=kpm2)
    kpmf = rand(rng, B, Lk)
    kpmf[1, 3] = -np.inf
    mha_case(mha, "kpm_float", rng, q, k, v, key_padding_mask=kpmf)


def test_mha_grad_attn_mask():
    rng = np.random.default_rng(9)
    E, H, B, Lq, Lk = 12, 3, 2, 4, 6
    mha = _with_biases(attn.MultiheadAttention(E, H, kdim=7, vdim=9, seed=9), rng)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, 7), rand(rng, B, Lk, 9)
    bm = rng.random((Lq, Lk)) < 0.3  # True = NOT allowed (torch)
    bm[:, 2] = False
    mha_case(mha, "attn_mask_bool", rng, q, k, v, attn_mask=bm)
    bm3 = rng.random((B * H, Lq, Lk)) < 0.3
    bm3[..., 1] = False
    mha_case(mha, "attn_mask_bool", rng, q, k, v, attn_mask=bm3)
    fm = rand(rng, Lq, Lk)
    mha_case(mha, "attn_mask_float", rng, q, k, v, attn_mask=fm)
    fm3 = rand(rng, B * H, Lq, Lk)
    fm3[1, 2, :3] = -np.inf
    mha_case(mha, "attn_mask_float", rng, q, k, v, attn_mask=fm3)


def test_mha_grad_is_causal():
    rng = np.random.default_rng(8)
    E, H, B, L = 16, 4, 2, 9
    mha = _with_biases(attn.MultiheadAttention(E, H, seed=8), rng)
    x = rand(rng, B, L, E)
    causal = np.triu(np.ones((L, L), bool), k=1)  # True = NOT allowed
    mha_case(mha, "is_causal", rng, x, x, x, self_attn=True, is_causal=True,
             torch_kw={"attn_mask": _t(causal)})
    mha_case(mha, "attn_mask_bool", rng, x, x, x, self_attn=True, attn_mask=causal)
    # Lq < Lk: bottom-right aligned
    Lq, Lk = 3, 7
    q, kv = rand(rng, B, Lq, E), rand(rng, B, Lk, E)
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    mha_case(mha, "is_causal", rng, q, kv, kv, kv_same=True, is_causal=True,
             torch_kw={"attn_mask": _t(j > i + Lk - Lq)})


def test_mha_grad_combined():
    rng = np.random.default_rng(10)
    E, H, B, Lq, Lk = 8, 2, 2, 3, 5
    mha = _with_biases(attn.MultiheadAttention(E, H, batch_first=False, seed=10), rng)
    q, k, v = rand(rng, Lq, B, E), rand(rng, Lk, B, E), rand(rng, Lk, B, E)
    kpm, am = rand(rng, B, Lk), rand(rng, Lq, Lk)
    # float kpm + float attn_mask add up; torch 1.13 gets the sum
    total = (am[None, None] + kpm[:, None, None, :]).repeat(H, 1).reshape(B * H, Lq, Lk)
    mha_case(mha, "combined", rng, q, k, v, key_padding_mask=kpm, attn_mask=am,
             torch_kw={"key_padding_mask": None, "attn_mask": _t(total)})
    # bool kpm + float attn_mask + is_causal
    kpm_b = np.zeros((B, Lk), bool)
    kpm_b[0, 1] = True
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    am_c = np.where(j > i + Lk - Lq, -np.inf, am)
    mha_case(mha, "combined", rng, q, k, v, key_padding_mask=kpm_b, attn_mask=am,
             is_causal=True, torch_kw={"attn_mask": _t(am_c)})


def test_mha_grad_fully_masked_rows():
    # torch.nn gives NaN everywhere; the functional oracle gives those rows
    # zero attention, as the library does
    rng = np.random.default_rng(11)
    E, H, B, Lq, Lk = 8, 2, 3, 6, 4
    mha = _with_biases(attn.MultiheadAttention(E, H, kdim=5, vdim=6, seed=11), rng)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, 5), rand(rng, B, Lk, 6)
    kpm = np.zeros((B, Lk), bool)
    kpm[1] = True  # batch 1 sees nothing
    kpm[2, 2:] = True
    keep = (~kpm)[:, None, None, :] & structural_keep((), Lq, Lk, causal=True)
    out, (dq, dk, dv), _ = mha_case(mha, "fully_masked", rng, q, k, v,
                                    key_padding_mask=kpm, is_causal=True,
                                    functional=dict(keep=keep))
    # Lq > Lk: the first two queries see no key, nor does batch 1
    assert np.all(dq[1] == 0) and np.all(dk[1] == 0) and np.all(dv[1] == 0)
    assert np.all(dq[:, :2] == 0)


def test_mha_grad_functional_oracle_matches_nn():
    # the hand-written oracle used for dropout and fully masked rows agrees
    # with torch.nn.MultiheadAttention where both are defined
    rng = np.random.default_rng(12)
    E, H, B, Lq, Lk = 12, 3, 2, 5, 7
    for kdim, bias in ((4, True), (E, False)):
        mha = _with_biases(attn.MultiheadAttention(E, H, kdim=kdim, vdim=9,
                                                   bias=bias, seed=4), rng)
        q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, kdim), rand(rng, B, Lk, 9)
        am, g = rand(rng, Lq, Lk), _t(rand(rng, B, Lq, E))
        grads = []
        for functional in (False, True):
            X, K, V = _t(q, True), _t(k, True), _t(v, True)
            if functional:
                params = {n: _t(a, True) for n, a in _our_params(mha).items()}
                out = torch_mha_functional(params, E, H, X, K, V, add=am)
            else:
                tm = torch_twin(mha)
                out, _ = tm(X, K, V, attn_mask=_t(am), need_weights=False)
                tp = dict(tm.named_parameters())
                params = {n: tp[OUR_TO_TORCH[n]] for n in _our_params(mha)}
            out.backward(g)
            grads.append([out.detach()] + [t.grad for t in (X, K, V)] +
                         [params[n].grad for n in sorted(params)])
        for a, b in zip(*grads):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_mha_grad_larger():
    rng = np.random.default_rng(13)
    E, H, B, Lq, Lk = 64, 8, 2, 40, 56
    mha = _with_biases(attn.MultiheadAttention(E, H, kdim=48, vdim=32, seed=13), rng)
    q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, 48), rand(rng, B, Lk, 32)
    kpm = np.zeros((B, Lk), bool)
    kpm[1, 30:] = True
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    mha_case(mha, "larger", rng, q, k, v, key_padding_mask=kpm,
             attn_mask=j > i + Lk - Lq)


@pytest.mark.parametrize("p", [0.2, 0.6])
@pytest.mark.parametrize("self_attn", [True, False])
def test_mha_grad_dropout_vs_autograd(p, self_attn):
    rng = np.random.default_rng(int(p * 10) + 7 * self_attn)
    E, H, B, Lq = 16, 4, 2, 6
    Lk = Lq if self_attn else 9
    mha = _with_biases(attn.MultiheadAttention(E, H, dropout=p, seed=77,
                                               batch_first=False), rng)
    q = rand(rng, Lq, B, E)
    k = q if self_attn else rand(rng, Lk, B, E)
    kpm = np.zeros((B, Lk), bool)
    kpm[1, -2:] = True
    keep = (~kpm)[:, None, None, :] & structural_keep((), Lq, Lk, causal=True)
    for offset in range(3):  # each training forward advances the offset
        drop = dropout_multipliers((B, H), Lq, Lk, p, seed=77, offset=offset)
        mha_case(mha, "dropout", rng, q, k, k, self_attn=self_attn,
                 kv_same=not self_attn, key_padding_mask=kpm, is_causal=True,
                 functional=dict(keep=keep, drop=drop))


# ------------------------------------------------------------ MHA semantics

def test_mha_backward_state_errors():
    rng = np.random.default_rng(20)
    mha = attn.MultiheadAttention(8, 2, seed=1)
    x = rand(rng, 2, 5, 8)
    with pytest.raises(attn.AttnStateError, match="forward"):
        mha.backward(np.zeros((2, 5, 8), np.float32))
    with pytest.raises(RuntimeError):
        mha.backward(np.zeros((2, 5, 8), np.float32))
    out, _ = mha(x, x, x)
    with pytest.raises(ValueError):  # wrong shape
        mha.backward(np.zeros((2, 5, 7), np.float32))
    with pytest.raises(ValueError):
        mha.backward(np.zeros((5, 2, 8), np.float32))
    mha.backward(np.ones_like(out))
    mha.release_saved()
    with pytest.raises(attn.AttnStateError):
        mha.backward(np.ones_like(out))
    mha(x, x, x)
    mha.requires_grad_(False)
    with pytest.raises(attn.AttnStateError):
        mha.backward(np.ones_like(out))
    mha.requires_grad = True
    mha.requires_grad = False
    mha(x, x, x)  # a forward without saving replaces the saved state
    with pytest.raises(attn.AttnStateError, match="requires_grad"):
        mha.backward(np.ones_like(out))
    mha.requires_grad = True
    mha.eval()  # eval mode keeps the cache too (no dropout, still differentiable)
    mha(x, x, x)
    mha.backward(np.ones_like(out))


def test_mha_backward_fresh_accumulate_zero_grad():
    rng = np.random.default_rng(21)
    mha = _with_biases(attn.MultiheadAttention(8, 2, kdim=3, vdim=5, seed=1), rng)
    q, k, v = rand(rng, 2, 4, 8), rand(rng, 2, 6, 3), rand(rng, 2, 6, 5)
    out, _ = mha(q, k, v)
    g = rand(rng, *out.shape)
    d1 = mha.backward(g)
    g1 = {n: a.copy() for n, a in mha.grads.items()}
    buf1 = mha.grads_buffer
    d2 = mha.backward(g)  # again, fresh: the same numbers in new arrays
    assert mha.grads_buffer is not buf1
    for a, b in zip(d1, d2):
        np.testing.assert_array_equal(a, b)
    for n in g1:
        np.testing.assert_array_equal(mha.grads[n], g1[n])
    mha.backward(g, accumulate=True)
    for n in g1:
        np.testing.assert_allclose(mha.grads[n], 2 * g1[n], rtol=1e-6, atol=1e-7)
    # the packed buffer is parameters_buffer's layout, grads are views of it
    for n, a in mha.grads.items():
        assert np.shares_memory(a, mha.grads_buffer)
        assert a.shape == getattr(mha, n).shape
    mha.zero_grad()
    assert mha.grads is None and mha.grads_buffer is None
    mha.backward(g, accumulate=True)  # nothing to add to: fresh
    for n in g1:
        np.testing.assert_array_equal(mha.grads[n], g1[n])


def test_mha_backward_uses_what_the_forward_saw():
    # modifying the inputs or the parameters after the forward does not
    # change that forward's gradients
    rng = np.random.default_rng(22)
    mha = _with_biases(attn.MultiheadAttention(8, 2, seed=2), rng)
    x = rand(rng, 2, 5, 8)
    out, _ = mha(x, x, x)
    g = rand(rng, *out.shape)
    d_ref = mha.backward(g)[0].copy()
    g_ref = mha.grads_buffer.copy()
    out, _ = mha(x, x, x)
    x *= 3.0
    mha.parameters_buffer[:] *= 0.5
    d = mha.backward(g)[0]
    np.testing.assert_array_equal(d, d_ref)
    np.testing.assert_array_equal(mha.grads_buffer, g_ref)


def test_mha_backward_sgd_step_lowers_loss():
    # the gradient is the gradient: a small step against it lowers
    # loss = 0.5 * |out - target|^2
    rng = np.random.default_rng(23)
    mha = _with_biases(attn.MultiheadAttention(16, 4, seed=3), rng)
    x, target = rand(rng, 2, 6, 16), rand(rng, 2, 6, 16)
    losses = []
    for _ in range(5):
        out, _ = mha(x, x, x, need_weights=False)
        losses.append(0.5 * float(((out - target) ** 2).sum()))
        mha.backward(out - target)
        mha.parameters_buffer -= 0.01 * mha.grads_buffer
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_mha_backward_torch_tensors():
    rng = np.random.default_rng(24)
    mha = attn.MultiheadAttention(8, 2, seed=4)
    x = torch.from_numpy(rand(rng, 2, 5, 8)).requires_grad_(True)
    out, _ = mha(x, x, x)
    d = mha.backward(torch.ones(out.shape))
    assert d[0] is d[1] is d[2] and d[0].shape == (2, 5, 8)


# ================================================================== dropout

def _sdpa_problem(rng, lead=(2, 3), Lq=9, Lk=13, Dk=8, Dv=6):
    return (rand(rng, *lead, Lq, Dk), rand(rng, *lead, Lk, Dk),
            rand(rng, *lead, Lk, Dv), rand(rng, *lead, Lq, Dv))


def _sdpa_all(q, k, v, g, **kw):
    out = attn.scaled_dot_product_attention(q, k, v, **kw)
    return (out,) + attn.scaled_dot_product_attention_grad(g, q, k, v, **kw)


def test_dropout_seed_determinism():
    rng = np.random.default_rng(90)
    q, k, v, g = _sdpa_problem(rng)
    kw = dict(dropout_p=0.3, is_causal=True, key_padding_lengths=[13, 7])
    a = _sdpa_all(q, k, v, g, seed=5, **kw)
    b = _sdpa_all(q, k, v, g, seed=5, **kw)
    c = _sdpa_all(q, k, v, g, seed=6, **kw)
    d = _sdpa_all(q, k, v, g, seed=5, offset=1, **kw)
    for x, y, z, w in zip(a, b, c, d):
        np.testing.assert_array_equal(x, y)
        assert not np.array_equal(x, z)
        assert not np.array_equal(x, w)
    # the layer: same seed -> same outputs and gradients; the offset
    # advances per training forward, so consecutive calls differ
    x, gx = rand(rng, 2, 7, 16), rand(rng, 2, 7, 16)
    params = attn.MultiheadAttention(16, 4, seed=1).state_dict()
    res = []
    for seed in (5, 5, 6):
        m = attn.MultiheadAttention(16, 4, dropout=0.3, seed=seed)
        m.load_state_dict(params)
        out, _ = m(x, x, x)
        d = m.backward(gx)
        res.append((out, d[0], m.grads_buffer.copy()))
        out2, _ = m(x, x, x)
        assert not np.array_equal(out, out2)
    for r1, r2, r3 in zip(*res):
        np.testing.assert_array_equal(r1, r2)
        assert not np.array_equal(r1, r3)


def test_dropout_thread_count_bitwise(restore_threads):
    rng = np.random.default_rng(91)
    q, k, v, g = _sdpa_problem(rng, lead=(3, 4), Lq=17, Lk=23)
    kw = dict(dropout_p=0.4, seed=9, offset=2, is_causal=True,
              key_padding_lengths=[23, 11, 5], attn_mask=rand(rng, 17, 23))
    E = 16
    x = rand(rng, 3, 11, E)
    gx = rand(rng, 3, 11, E)
    results = []
    for n in (1, 2, 3):
        attn.set_num_threads(n)
        sd = _sdpa_all(q, k, v, g, **kw)
        m = attn.MultiheadAttention(E, 4, dropout=0.4, seed=9)
        out, w = m(x, x, x, is_causal=True)
        d = m.backward(gx)
        results.append(sd + (out, w, d[0], m.grads_buffer.copy()))
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_array_equal(a, b)
    # num_threads per call, too
    attn.set_num_threads(1)
    for n in (2, 3):
        for a, b in zip(results[0][:4], _sdpa_all(q, k, v, g, num_threads=n, **kw)):
            np.testing.assert_array_equal(a, b)


def _z(count, n, p):
    """z-score of count successes in n Bernoulli(p) trials."""
    return (count - n * p) / math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_rate(p):
    # q = k = 0 and v = I make the output show every element's mask
    lead, Lq, Lk = (2, 4), 128, 256
    seed = 1234
    m0 = dropout_multipliers(lead, Lq, Lk, p, seed, 0) > 0
    m1 = dropout_multipliers(lead, Lq, Lk, p, seed, 1) > 0
    m2 = dropout_multipliers(lead, Lq, Lk, p, seed + 1, 0) > 0
    N = m0.size
    z = _z(int(m0.sum()), N, 1 - p)
    # each lane of a Philox block (j % 4), and pairs of streams independent
    lanes = [_z(int(m0[..., r::4].sum()), m0[..., r::4].size, 1 - p) for r in range(4)]
    z_off = _z(int((m0 & m1).sum()), N, (1 - p) ** 2)
    z_seed = _z(int((m0 & m2).sum()), N, (1 - p) ** 2)
    # neighbours in j (same Philox output word group) independent
    z_adj = _z(int((m0[..., 1:] & m0[..., :-1]).sum()), m0[..., 1:].size, (1 - p) ** 2)
    record_stat("keep rate p=%.1f" % p,
                "N=%d kept %.5f (expect %.5f) z=%+.2f; lanes j%%4 z=%s; "
                "offset0&1 z=%+.2f; seed&seed+1 z=%+.2f; adjacent-j z=%+.2f"
                % (N, m0.mean(), 1 - p, z, " ".join("%+.2f" % x for x in lanes),
                   z_off, z_seed, z_adj))
    for x in [z, z_off, z_seed, z_adj] + lanes:
        assert abs(x) < 4.0, (p, x)


def test_dropout_expectation_matches_no_dropout():
    # inverted dropout is unbiased for the output (and for dv, linear in the
    # mask): the mean over n seeds is within 5 standard errors (s/sqrt(n))
    # of the no-dropout value, element by element
    rng = np.random.default_rng(93)
    p, n = 0.3, 400
    q, k, v, g = _sdpa_problem(rng, lead=(2, 2), Lq=8, Lk=16, Dv=8)
    kw = dict(is_causal=True, key_padding_lengths=[16, 10])
    ref_out = attn.scaled_dot_product_attention(q, k, v, **kw).astype(np.float64)
    ref_dv = attn.scaled_dot_product_attention_grad(g, q, k, v, **kw)[2].astype(np.float64)
    outs, dvs = [], []
    for seed in range(n):
        outs.append(attn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed, **kw))
        dvs.append(attn.scaled_dot_product_attention_grad(g, q, k, v, dropout_p=p,
                                                          seed=seed, **kw)[2])
    # the layer (its offset advances per training forward)
    E = 16
    mha = _with_biases(attn.MultiheadAttention(E, 4, dropout=p, seed=5), rng)
    x = rand(rng, 2, 6, E)
    mha.eval()
    ref_mha = mha(x, x, x)[0].astype(np.float64)
    mha.train()
    mouts = [mha(x, x, x, need_weights=False)[0] for _ in range(n)]
    for label, samples, ref in (("sdpa out", outs, ref_out), ("sdpa dv", dvs, ref_dv),
                                ("mha out", mouts, ref_mha)):
        s = np.asarray(samples, dtype=np.float64)
        mean, sd = s.mean(axis=0), s.std(axis=0, ddof=1)
        se = sd / math.sqrt(n)
        ok = se > 0
        assert np.array_equal(mean[~ok], ref[~ok])  # no randomness there
        z = (mean[ok] - ref[ok]) / se[ok]
        record_stat("expectation " + label,
                    "n=%d seeds, %d elements: max|mean-ref|/(s/sqrt(n)) = %.2f, "
                    "mean z^2 = %.3f (expect ~1), max|mean-ref| = %.2e, max s/sqrt(n) = %.2e"
                    % (n, z.size, np.abs(z).max(), (z ** 2).mean(),
                       np.abs(mean - ref).max(), se.max()))
        assert np.abs(z).max() < 5.0, (label, np.abs(z).max())
        assert 0.7 < (z ** 2).mean() < 1.3, (label, (z ** 2).mean())


def test_philox_known_answers():
    # Random123's kat_vectors for philox4x32_10
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2,
            (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        got = philox4x32_10(np.array(ctr, dtype=np.uint32), key)
        assert [int(x) for x in got] == list(want)


@pytest.mark.parametrize("p,seed,offset", [(0.1, 0, 0), (0.5, 1234, 3),
                                           (0.9, 2**64 - 1, 2**40 + 1), (0.3, 7, 0)])
def test_dropout_mask_is_the_documented_philox(p, seed, offset):
    # the mask read back through the forward is, bit for bit, Philox-4x32-10
    # keyed by (seed, offset) with counter (j / 4, i, h, b) (attn.h; the
    # (seed, offset) -> key map is src/dropout.c's splitmix64)
    B, H, Lq, Lk = 2, 3, 17, 37
    got = dropout_multipliers((B, H), Lq, Lk, p, seed, offset) > 0
    want = philox_keep(B, H, Lq, Lk, p, seed, offset)
    assert np.array_equal(got, want), (got != want).sum()


@pytest.mark.parametrize("p", [1.0, 1.5, -0.1, float("nan"), float("inf")])
def test_dropout_p_out_of_range(p):
    rng = np.random.default_rng(94)
    q, k, v, g = _sdpa_problem(rng)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, dropout_p=p)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention_grad(g, q, k, v, dropout_p=p)
    with pytest.raises(ValueError):
        attn.MultiheadAttention(8, 2, dropout=p)


def test_dropout_p0_and_eval_are_exact_noops():
    rng = np.random.default_rng(95)
    q, k, v, g = _sdpa_problem(rng)
    kw = dict(is_causal=True, key_padding_lengths=[13, 4])
    base = _sdpa_all(q, k, v, g, **kw)
    for a, b in zip(base, _sdpa_all(q, k, v, g, dropout_p=0.0, seed=77, offset=3, **kw)):
        np.testing.assert_array_equal(a, b)
    # the layer: dropout=0 in training == eval == dropout=0.5 in eval
    E = 16
    x, gx = rand(rng, 2, 7, E), rand(rng, 2, 7, E)
    ref = attn.MultiheadAttention(E, 4, seed=3)
    _with_biases(ref, rng)
    res = []
    for dropout, training in ((0.0, True), (0.0, False), (0.5, False)):
        m = attn.MultiheadAttention(E, 4, dropout=dropout, seed=3)
        m.load_state_dict(ref.state_dict())
        m.train(training)
        out, w = m(x, x, x, is_causal=True)
        d = m.backward(gx)
        res.append((out, w, d[0], m.grads_buffer.copy()))
        out2, _ = m(x, x, x, is_causal=True)  # no offset advance, no mask
        np.testing.assert_array_equal(out, out2)
    for r in res[1:]:
        for a, b in zip(res[0], r):
            np.testing.assert_array_equal(a, b)


# ================================================================== numeric

def _directional(f, x, d, eps):
    """Central difference of scalar f along d at x (x modified in place and
    restored)."""
    x0 = x.copy()
    x[...] = x0 + eps * d
    fp = f()
    x[...] = x0 - eps * d
    fm = f()
    x[...] = x0
    return (fp - fm) / (2 * eps)


def test_numeric_directional_derivatives():
    # independent of PyTorch: <grad, d> vs a central difference of
    # loss = sum(g * out) through the binding, along random directions d
    # (float32 forward, so a loose 2e-2 tolerance)
    rng = np.random.default_rng(96)
    q, k, v, g = _sdpa_problem(rng, lead=(2, 2), Lq=5, Lk=7, Dv=4)
    kw = dict(is_causal=True, attn_mask=rand(rng, 5, 7), dropout_p=0.25, seed=3)
    grads = attn.scaled_dot_product_attention_grad(g, q, k, v, **kw)

    def loss():
        out = attn.scaled_dot_product_attention(q, k, v, **kw)
        return float((out.astype(np.float64) * g).sum())

    worst = 0.0
    for x, gx in zip((q, k, v), grads):
        for _ in range(2):
            d = rand(rng, *x.shape)
            num = _directional(loss, x, d, 1e-2)
            ana = float((gx.astype(np.float64) * d).sum())
            worst = max(worst, abs(num - ana) / max(abs(ana), 1e-3))
    # the layer: inputs and the packed parameters
    mha = _with_biases(attn.MultiheadAttention(8, 2, kdim=3, vdim=5, dropout=0.2,
                                               seed=8), rng)
    mha.eval()  # a fixed function (no dropout draw per call)
    xq, xk, xv = rand(rng, 2, 4, 8), rand(rng, 2, 6, 3), rand(rng, 2, 6, 5)
    gm = rand(rng, 2, 4, 8)

    def mloss():
        out, _ = mha(xq, xk, xv, need_weights=False)
        return float((out.astype(np.float64) * gm).sum())

    mha(xq, xk, xv)
    dq, dk, dv = mha.backward(gm)
    gbuf = mha.grads_buffer.copy()
    for x, gx in ((xq, dq), (xk, dk), (xv, dv), (mha.parameters_buffer, gbuf)):
        for _ in range(2):
            d = rand(rng, *x.shape)
            num = _directional(mloss, x, d, 1e-2)
            ana = float((gx.astype(np.float64) * d).sum())
            worst = max(worst, abs(num - ana) / max(abs(ana), 1e-3))
    record_stat("numeric", "central differences vs gradients (SDPA with "
                "dropout, MHA inputs and packed parameters): max rel err %.2e"
                % worst)
    assert worst < 2e-2, worst

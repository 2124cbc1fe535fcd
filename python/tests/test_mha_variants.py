"""The attention variants in the numpy multi-head layer:
attn.MultiheadAttention.forward(..., softcap=, alibi_slopes=, sinks=), with
and without grouped-query attention, against test_mha_gqa.py's float64 torch layer,
written from the variants' definitions (an explicit c * tanh(s / c), the ALiBi
bias -m_h * |i + Lk - Lq - j| after it, the sink as an extra softmax column
that is dropped afterwards); gradients (the sinks' included) against torch
autograd through it.

Tolerances are test_mha_gqa.py's (_oracle.TOL 1e-5 of max|ref| for outputs
and weights, GRAD_TOL for gradients): float32 sums over <= 24 terms, ~1e-7
from float64; a variant applied in the wrong order, to the wrong head or
not at all is O(0.1) or more at these sizes.
"""

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
from _oracle import check_close, check_grad, rand
from test_mha_gqa import randomize, ref_layer, split_params


VARIANTS = {
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "all": dict(softcap=2.0, alibi=True, sinks=True),
}


@pytest.mark.parametrize("Hkv", [2, 6])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", ["self-causal", "cross-padded"])
def test_numpy_layer_variants_vs_reference(Hkv, variant, case):
    E, H, B, Lq, Lk = 24, 6, 2, 5, 7
    rng = np.random.default_rng(Hkv * 100 + len(variant) * 10 + len(case))
    mha = attn.MultiheadAttention(E, H, num_kv_heads=Hkv, seed=5)
    randomize(mha, rng)
    if case == "self-causal":
        q = k = v = rand(rng, B, Lq, E)
        Lk = Lq
    else:
        q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, E), rand(rng, B, Lk, E)
    kw, fkw = VARIANTS[variant], {}
    slopes = sinks = None
    if "softcap" in kw:
        fkw["softcap"] = kw["softcap"]
    if kw.get("alibi"):
        # distinct slopes per head (a head mix-up shows), steep enough to matter
        slopes = (0.9 * 0.5 ** np.arange(H)).astype(np.float32)
        fkw["alibi_slopes"] = slopes
    if kw.get("sinks"):
        sinks = rand(rng, H)
        fkw["sinks"] = sinks
    kpm = None
    if case == "self-causal":
        fkw["is_causal"] = True
    else:
        kpm = np.zeros((B, Lk), bool)
        kpm[1, 4:] = True
        kpm[0, 2] = True
        fkw["key_padding_mask"] = kpm
    out, w = mha(q, k, v, average_attn_weights=False, **fkw)

    P = split_params(mha.state_dict(), E, mha.kv_dim, mha.bias)
    xq = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    same = case == "self-causal"
    xk = xq if same else torch.tensor(k, dtype=torch.float64, requires_grad=True)
    xv = xq if same else torch.tensor(v, dtype=torch.float64, requires_grad=True)
    t_sinks = None if sinks is None else torch.tensor(sinks, dtype=torch.float64,
                                                      requires_grad=True)
    ref, p = ref_layer(xq, xk, xv, *P, H=H, Hkv=Hkv, causal=same,
                       key_padding_mask=None if kpm is None else torch.from_numpy(kpm),
                       softcap=kw.get("softcap"),
                       slopes=None if slopes is None else torch.from_numpy(
                           slopes.astype(np.float64)),
                       sinks=t_sinks)
    label = "%s/%s/%d" % (variant, case, Hkv)
    check_close("mha-variants/%s/out" % label, out, ref.detach().numpy())
    check_close("mha-variants/%s/weights" % label, w, p.detach().numpy())

    g = rand(rng, *out.shape)
    grads = mha.backward(g)
    assert len(grads) == (4 if sinks is not None else 3)
    ref.backward(torch.from_numpy(g.astype(np.float64)))
    grp = "mha-variants-numpy"
    check_grad(grp, label, "query", grads[0], xq.grad.numpy())
    if not same:
        check_grad(grp, label, "key", grads[1], xk.grad.numpy())
        check_grad(grp, label, "value", grads[2], xv.grad.numpy())
    if sinks is not None:
        assert grads[3].shape == (H,) and grads[3].dtype == np.float32
        check_grad(grp, label, "sinks", grads[3], t_sinks.grad.numpy())
    wq, wk, wv, bq, bk, bv, wo, bo = P
    want = torch.cat([wq.grad, wk.grad, wv.grad]).numpy()
    check_grad(grp, label, "in_proj_weight", mha.grads["in_proj_weight"], want)
    check_grad(grp, label, "out_proj_weight", mha.grads["out_proj_weight"], wo.grad.numpy())
    want = torch.cat([bq.grad, bk.grad, bv.grad]).numpy()
    check_grad(grp, label, "in_proj_bias", mha.grads["in_proj_bias"], want)


def test_numpy_layer_sinks_grad_fresh_per_backward():
    """Two backward() calls of one forward give the same d_sinks (fresh,
    not accumulated into the first one's array)."""
    rng = np.random.default_rng(7)
    mha = attn.MultiheadAttention(16, 4, num_kv_heads=2, seed=1)
    x = rand(rng, 2, 6, 16)
    mha(x, x, x, is_causal=True, sinks=rand(rng, 4))
    g = rand(rng, 2, 6, 16)
    d1 = mha.backward(g)[3]
    d2 = mha.backward(g)[3]
    assert d1 is not d2 and np.array_equal(d1, d2) and np.any(d1 != 0)


def test_numpy_layer_variants_off_is_plain():
    """softcap/alibi_slopes/sinks None give bitwise the plain call."""
    rng = np.random.default_rng(3)
    mha = attn.MultiheadAttention(16, 4, seed=2)
    x = rand(rng, 2, 6, 16)
    a = mha(x, x, x, is_causal=True)
    b = mha(x, x, x, is_causal=True, softcap=None, alibi_slopes=None, sinks=None)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("bad, exc, words", [
    (dict(softcap=0.0), ValueError, "softcap"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi_slopes"),
    (dict(alibi_slopes=np.array([1, np.nan, 1, 1], np.float32)), ValueError, "slope"),
    (dict(sinks=np.ones((2, 2), np.float32)), ValueError, "sinks"),
    (dict(sinks=np.array([0, 0, np.inf, 0], np.float32)), ValueError, "sink"),
])
def test_numpy_layer_bad_variant_args(bad, exc, words):
    mha = attn.MultiheadAttention(16, 4, seed=2)
    x = np.zeros((1, 3, 16), np.float32)
    with pytest.raises(exc, match="(?i)" + words):
        mha(x, x, x, **bad)

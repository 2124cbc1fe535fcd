"""Grouped-query / multi-query attention in the multi-head layer:
attn.MultiheadAttention(..., num_kv_heads=) (numpy) and
attn.torch.MultiheadAttention(..., num_kv_heads=) against a pure-torch
float64 layer written here with repeat_interleave (PyTorch's GQA convention:
query head h reads K/V head h // (H // H_kv)); gradients against torch
autograd through it.

Tolerances are test_mha.py's and test_torch.py's (_oracle.TOL 1e-5 of
max|ref| for outputs, GRAD_TOL 1e-4 for gradients): ours is float32 with
sums over <= 24 terms, ~1e-7 from float64; a wrong head mapping or a wrong
projection is O(1).
"""
import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
import attn.torch as at
from _oracle import check_close, check_grad, rand


def ref_layer(xq, xk, xv, wq, wk, wv, bq, bk, bv, wo, bo, H, Hkv, causal=False,
              key_padding_mask=None, attn_mask=None, softcap=None, slopes=None, sinks=None):
    """float64 GQA multi-head attention with the variants, batch first:
    -> (out [B, Lq, E], per-head weights [B, H, Lq, Lk]). In this
    order: softcap c * tanh(s / c), the ALiBi bias -m_h * |i' - j| (slopes
    [H], i' = i + Lk - Lq), attn_mask float [Lq, Lk] added, causal j <= i',
    key_padding_mask bool [B, Lk] (True = ignore), and the sinks [H] as one
    more softmax column that is dropped afterwards."""
    B, Lq, E = xq.shape
    Lk = xk.shape[1]
    D, G = E // H, H // Hkv
    q = (xq @ wq.T + bq).reshape(B, Lq, H, D).transpose(1, 2)
    k = (xk @ wk.T + bk).reshape(B, Lk, Hkv, D).transpose(1, 2).repeat_interleave(G, dim=1)
    v = (xv @ wv.T + bv).reshape(B, Lk, Hkv, D).transpose(1, 2).repeat_interleave(G, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    ipos = torch.arange(Lq, dtype=torch.float64)[:, None] + (Lk - Lq)  # i'
    jpos = torch.arange(Lk, dtype=torch.float64)[None, :]
    if slopes is not None:
        s = s - slopes[None, :, None, None] * (ipos - jpos).abs()
    if attn_mask is not None:
        s = s + attn_mask
    if causal:
        s = s.masked_fill(jpos > ipos, float("-inf"))
    if key_padding_mask is not None:
        s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if sinks is not None:
        col = sinks[None, :, None, None].expand(B, H, Lq, 1)
        p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :Lk]
    else:
        p = torch.softmax(s, dim=-1)
    o = (p @ v).transpose(1, 2).reshape(B, Lq, E)
    return o @ wo.T + bo, p


def split_params(sd, E, Ekv, bias):
    """float64 tensors (requiring grad) wq, wk, wv, bq, bk, bv, wo, bo from a
    state_dict with torch's names (packed or separate projections)."""
    def t(a):
        a = a.detach().numpy() if hasattr(a, "detach") else a
        return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)

    if "in_proj_weight" in sd:
        w = np.asarray(sd["in_proj_weight"].detach() if hasattr(sd["in_proj_weight"], "detach")
                       else sd["in_proj_weight"])
        assert w.shape == (E + 2 * Ekv, E)
        wq, wk, wv = t(w[:E]), t(w[E:E + Ekv]), t(w[E + Ekv:])
    else:
        wq, wk, wv = t(sd["q_proj_weight"]), t(sd["k_proj_weight"]), t(sd["v_proj_weight"])
        assert wk.shape[0] == Ekv and wv.shape[0] == Ekv
    if bias:
        b = sd["in_proj_bias"]
        b = np.asarray(b.detach() if hasattr(b, "detach") else b)
        assert b.shape == (E + 2 * Ekv,)
        bq, bk, bv = t(b[:E]), t(b[E:E + Ekv]), t(b[E + Ekv:])
        bo = t(sd["out_proj.bias"])
    else:
        bq = torch.zeros(E, dtype=torch.float64)
        bk = bv = torch.zeros(Ekv, dtype=torch.float64)
        bo = torch.zeros(E, dtype=torch.float64)
    return wq, wk, wv, bq, bk, bv, t(sd["out_proj.weight"]), bo


def randomize(mha, rng):
    """Nonzero biases too (PyTorch initialises them to 0, which would hide
    a bias in the wrong place)."""
    mha.parameters_buffer = rng.uniform(-0.5, 0.5, mha.parameters_buffer.shape)


# ------------------------------------------------------------------ numpy binding

@pytest.mark.parametrize("Hkv", [1, 2, 3, 6])
@pytest.mark.parametrize("case", ["self-causal", "cross-padded", "cross-kdim-nobias"])
def test_numpy_layer_vs_reference(Hkv, case):
    E, H, B, Lq, Lk = 24, 6, 2, 5, 7
    rng = np.random.default_rng(Hkv * 10 + len(case))
    kw = dict(kdim=10, vdim=14, bias=False) if case == "cross-kdim-nobias" else {}
    mha = attn.MultiheadAttention(E, H, num_kv_heads=Hkv, seed=3, **kw)
    randomize(mha, rng)
    assert mha.num_kv_heads == Hkv and mha.kv_dim == Hkv * (E // H)
    if case == "self-causal":
        q = k = v = rand(rng, B, Lq, E)
        Lk = Lq
    else:
        q, k, v = rand(rng, B, Lq, E), rand(rng, B, Lk, mha.kdim), rand(rng, B, Lk, mha.vdim)
    fkw = {}
    kpm = None
    amask = None
    if case == "self-causal":
        fkw["is_causal"] = True
    if case == "cross-padded":
        kpm = np.zeros((B, Lk), bool)
        kpm[1, 4:] = True
        kpm[0, 2] = True  # not a prefix: a bool mask, not key lengths
        amask = rand(rng, Lq, Lk)
        fkw.update(key_padding_mask=kpm, attn_mask=amask)
    out, w = mha(q, k, v, average_attn_weights=False, **fkw)

    P = split_params(mha.state_dict(), E, mha.kv_dim, mha.bias)
    xq = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    xk = xq if case == "self-causal" else torch.tensor(k, dtype=torch.float64, requires_grad=True)
    xv = xq if case == "self-causal" else torch.tensor(v, dtype=torch.float64, requires_grad=True)
    ref, p = ref_layer(xq, xk, xv, *P, H=H, Hkv=Hkv, causal=case == "self-causal",
                       key_padding_mask=None if kpm is None else torch.from_numpy(kpm),
                       attn_mask=None if amask is None else torch.from_numpy(
                           amask.astype(np.float64)))
    check_close("mha-gqa/%s/%d/out" % (case, Hkv), out, ref.detach().numpy())
    check_close("mha-gqa/%s/%d/weights" % (case, Hkv), w, p.detach().numpy())

    g = rand(rng, *out.shape)
    dq, dk, dv = mha.backward(g)
    ref.backward(torch.from_numpy(g.astype(np.float64)))
    grp = "mha-gqa-numpy"
    label = "%s/%d" % (case, Hkv)
    check_grad(grp, label, "query", dq, xq.grad.numpy())
    if case != "self-causal":
        check_grad(grp, label, "key", dk, xk.grad.numpy())
        check_grad(grp, label, "value", dv, xv.grad.numpy())
    wq, wk, wv, bq, bk, bv, wo, bo = P
    if mha.in_proj_weight is not None:
        want = torch.cat([wq.grad, wk.grad, wv.grad]).numpy()
        assert mha.grads["in_proj_weight"].shape == want.shape
        check_grad(grp, label, "in_proj_weight", mha.grads["in_proj_weight"], want)
    else:
        for n, t in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), (wq, wk, wv)):
            check_grad(grp, label, n, mha.grads[n], t.grad.numpy())
    check_grad(grp, label, "out_proj_weight", mha.grads["out_proj_weight"], wo.grad.numpy())
    if mha.bias:
        # b_k's exact gradient is 0 (it shifts whole score rows): measured
        # within the packed bias, at the scale of b_q's and b_v's
        want = torch.cat([bq.grad, bk.grad, bv.grad]).numpy()
        check_grad(grp, label, "in_proj_bias", mha.grads["in_proj_bias"], want)
        check_grad(grp, label, "out_proj_bias", mha.grads["out_proj_bias"], bo.grad.numpy())


def test_numpy_full_kv_heads_is_plain_mha():
    """num_kv_heads = num_heads gives bitwise what the plain layer gives."""
    rng = np.random.default_rng(1)
    a = attn.MultiheadAttention(24, 6, seed=4)
    b = attn.MultiheadAttention(24, 6, seed=4, num_kv_heads=6)
    np.testing.assert_array_equal(a.parameters_buffer, b.parameters_buffer)
    x = rand(rng, 2, 9, 24)
    oa, wa = a(x, x, x, is_causal=True)
    ob, wb = b(x, x, x, is_causal=True)
    assert np.array_equal(oa, ob) and np.array_equal(wa, wb)
    g = rand(rng, 2, 9, 24)
    assert np.array_equal(a.backward(g)[0], b.backward(g)[0])
    assert np.array_equal(a.grads_buffer, b.grads_buffer)
    assert repr(a) == repr(b)


def test_numpy_init_is_xavier_over_stacked_projection():
    """Xavier-uniform over in_proj_weight [E + 2 kv_dim, E]: bound
    sqrt(6 / (E + E + 2 kv_dim)), values filling it; zero biases."""
    E, H, Hkv = 64, 8, 2
    m = attn.MultiheadAttention(E, H, num_kv_heads=Hkv, seed=7)
    w = m.in_proj_weight
    assert w.shape == (E + 2 * m.kv_dim, E) == (96, 64)
    bound = math.sqrt(6.0 / (E + E + 2 * m.kv_dim))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert not m.in_proj_bias.any() and m.in_proj_bias.shape == (96,)


def test_numpy_step_matches_forward():
    """Decoding over the H_kv-head cache: token by token and in chunks of 3,
    each output equal to the causal forward's row (float32 rounding)."""
    E, H, B, L = 24, 6, 2, 10
    rng = np.random.default_rng(2)
    for Hkv in (1, 2, 3):
        mha = attn.MultiheadAttention(E, H, num_kv_heads=Hkv, seed=5).eval()
        randomize(mha, rng)
        x = rand(rng, B, L, E)
        full, _ = mha(x, x, x, is_causal=True, need_weights=False)
        for chunk in (1, 3):
            st = mha.incremental_state(B, L, max_step=chunk)
            assert st.num_kv_heads == Hkv
            outs = [mha.step(x[:, t:t + chunk], st) for t in range(0, L, chunk)]
            check_close("mha-gqa/step/%d/%d" % (Hkv, chunk), np.concatenate(outs, axis=1), full)
            assert st.lengths.tolist() == [L, L]


def test_numpy_kv_cache_bytes():
    """The cache's keys and values take 2 * batch * max_len * kv_dim float32:
    H / H_kv times fewer; the rest (the step's scratch) does not depend on
    H_kv."""
    E, H, T = 64, 8, 4096
    n = {h: attn.MultiheadAttention(E, H, num_kv_heads=h).incremental_state(1, T).nbytes
         for h in (1, 2, 4, 8)}
    for h in (1, 2, 4):
        saved = n[8] - n[h]
        kv_saved = 2 * T * (H - h) * (E // H) * 4 + 2 * (H - h) * (E // H) * 4
        assert abs(saved - kv_saved) <= 4 * 64, (h, saved, kv_saved)
    assert n[8] / n[2] > 3.5


@pytest.mark.parametrize("bad", [0, -1, 4, 5, 7])
def test_numpy_bad_num_kv_heads(bad):
    with pytest.raises(attn.AttnError, match="num_kv_heads %d" % bad):
        attn.MultiheadAttention(24, 6, num_kv_heads=bad)


# ------------------------------------------------------------------ attn.torch

@pytest.mark.parametrize("Hkv", [1, 2, 4])
@pytest.mark.parametrize("case", ["self", "cross", "cross-kdim"])
def test_torch_layer_vs_reference(Hkv, case):
    E, H, B, Lq, Lk = 16, 4, 2, 5, 6
    torch.manual_seed(Hkv)
    kw = dict(kdim=6, vdim=10) if case == "cross-kdim" else {}
    mha = at.MultiheadAttention(E, H, num_kv_heads=Hkv, batch_first=True, **kw)
    with torch.no_grad():
        for prm in mha.parameters():
            prm.uniform_(-0.5, 0.5)
    Ekv = Hkv * (E // H)
    assert mha.kv_dim == Ekv
    if mha.in_proj_weight is not None:
        assert tuple(mha.in_proj_weight.shape) == (E + 2 * Ekv, E)
    else:
        assert tuple(mha.k_proj_weight.shape) == (Ekv, 6)
    assert tuple(mha.in_proj_bias.shape) == (E + 2 * Ekv,)
    xq = torch.randn(B, Lq, E, requires_grad=True)
    if case == "self":
        xk = xv = xq
        Lk = Lq
    else:
        xk = torch.randn(B, Lk, mha.kdim, requires_grad=True)
        xv = torch.randn(B, Lk, mha.vdim, requires_grad=True)
    kpm = torch.zeros(B, Lk, dtype=torch.bool)
    kpm[1, Lk - 2:] = True
    out, w = mha(xq, xk, xv, key_padding_mask=kpm, is_causal=case == "self",
                 average_attn_weights=True)
    P = split_params(mha.state_dict(), E, Ekv, True)
    rq = xq.detach().double().requires_grad_()
    rk = rq if case == "self" else xk.detach().double().requires_grad_()
    rv = rq if case == "self" else xv.detach().double().requires_grad_()
    ref, p = ref_layer(rq, rk, rv, *P, H=H, Hkv=Hkv, causal=case == "self",
                       key_padding_mask=kpm)
    check_close("mha-gqa-torch/%s/%d/out" % (case, Hkv), out.detach().numpy(),
                ref.detach().numpy())
    check_close("mha-gqa-torch/%s/%d/weights" % (case, Hkv), w.detach().numpy(),
                p.mean(dim=1).detach().numpy())
    g = torch.randn(B, Lq, E)
    out.backward(g)
    ref.backward(g.double())
    label = "%s/%d" % (case, Hkv)
    check_grad("mha-gqa-torch", label, "query", xq.grad.numpy(), rq.grad.numpy())
    if case != "self":
        check_grad("mha-gqa-torch", label, "key", xk.grad.numpy(), rk.grad.numpy())
        check_grad("mha-gqa-torch", label, "value", xv.grad.numpy(), rv.grad.numpy())
    wq, wk, wv, bq, bk, bv, wo, bo = P
    if mha.in_proj_weight is not None:
        check_grad("mha-gqa-torch", label, "in_proj_weight", mha.in_proj_weight.grad.numpy(),
                   torch.cat([wq.grad, wk.grad, wv.grad]).numpy())
    else:
        for t, r, n in ((mha.q_proj_weight, wq, "q"), (mha.k_proj_weight, wk, "k"),
                        (mha.v_proj_weight, wv, "v")):
            check_grad("mha-gqa-torch", label, n + "_proj_weight", t.grad.numpy(),
                       r.grad.numpy())
    check_grad("mha-gqa-torch", label, "in_proj_bias", mha.in_proj_bias.grad.numpy(),
               torch.cat([bq.grad, bk.grad, bv.grad]).numpy())
    check_grad("mha-gqa-torch", label, "out_proj.weight", mha.out_proj.weight.grad.numpy(),
               wo.grad.numpy())
    check_grad("mha-gqa-torch", label, "out_proj.bias", mha.out_proj.bias.grad.numpy(),
               bo.grad.numpy())


def test_torch_matches_numpy_binding():
    """The same parameters in both bindings give the same output (one
    library call each, the same float32 values)."""
    E, H, Hkv = 16, 4, 2
    torch.manual_seed(3)
    t = at.MultiheadAttention(E, H, num_kv_heads=Hkv, batch_first=True)
    n = attn.MultiheadAttention(E, H, num_kv_heads=Hkv)
    n.load_state_dict({k: v.detach() for k, v in t.state_dict().items()})
    x = torch.randn(2, 7, E)
    with torch.no_grad():
        ot, wt = t(x, x, x, is_causal=True)
    on, wn = n(x.numpy(), x.numpy(), x.numpy(), is_causal=True)
    np.testing.assert_array_equal(ot.numpy(), on)
    np.testing.assert_array_equal(wt.numpy(), wn)


def test_torch_zero_length_keys():
    """Lk = 0: out = out_proj.bias, as torch's module gives, with GQA too
    (torch's function run on the projections repeated over the groups)."""
    torch.manual_seed(4)
    mha = at.MultiheadAttention(16, 4, num_kv_heads=1, batch_first=True)
    with torch.no_grad():
        mha.out_proj.bias.uniform_(-1, 1)
    q = torch.randn(2, 3, 16, requires_grad=True)
    kv = torch.randn(2, 0, 16)
    out, w = mha(q, kv, kv)
    assert out.shape == (2, 3, 16) and w.shape == (2, 3, 0)
    torch.testing.assert_close(out, mha.out_proj.bias.expand(2, 3, 16))
    out.sum().backward()
    assert torch.equal(mha.out_proj.bias.grad, torch.full((16,), 6.0))


def test_torch_bad_num_kv_heads():
    for bad in (0, -2, 3, 8):
        with pytest.raises(ValueError, match="num_kv_heads %d must divide num_heads 4" % bad):
            at.MultiheadAttention(16, 4, num_kv_heads=bad)

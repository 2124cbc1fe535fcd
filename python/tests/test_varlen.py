"""attn.scaled_dot_product_attention_varlen(_grad) sequence by sequence
against PyTorch's math path and autograd (float64) and against attn's
padded path (key_padding_lengths, same seed: the same dropout mask)."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
from _oracle import (check_close, check_grad, rand, structural_keep,
                     torch_sdpa, torch_sdpa_grad)


def _pack(rng, lens, H, D, scale=1.0):
    """(total, H, D) rows and the [H, L, D] slice of each sequence."""
    x = rand(rng, int(sum(lens)), H, D, scale=scale)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return x, cu, [x[cu[s]:cu[s + 1]].transpose(1, 0, 2) for s in range(len(lens))]


CASES = [
    # name, lens_q, lens_k (None: self), H, Dk, Dv, causal, window
    ("molgen-like", [23, 57, 20, 41, 36], None, 4, 16, 16, True, None),
    ("empty sequences", [0, 5, 0, 1, 70], None, 2, 8, 4, False, None),
    ("cross lengths", [3, 12, 130, 0], [7, 12, 100, 5], 2, 8, 8, True, None),
    ("window", [40, 97, 1], None, 1, 8, 8, False, (9, 2)),
]


@pytest.mark.parametrize("name,lq,lk,H,Dk,Dv,causal,window", CASES)
@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_vs_torch(name, lq, lk, H, Dk, Dv, causal, window, impl):
    rng = np.random.default_rng(len(name) * 31 + len(lq))
    lk_ = lq if lk is None else lk
    q, cq, qs = _pack(rng, lq, H, Dk)
    k, ck, ks = _pack(rng, lk_, H, Dk)
    v, _, vs = _pack(rng, lk_, H, Dv)
    g, _, gs = _pack(rng, lq, H, Dv)
    cuk = None if lk is None else ck
    out, ws = attn.scaled_dot_product_attention_varlen(
        q, k, v, cq, cuk, is_causal=causal, window=window, need_weights=True,
        impl=impl)
    assert attn.last_path()[0] == impl
    dq, dk, dv = attn.scaled_dot_product_attention_varlen_grad(
        g, q, k, v, cq, cuk, is_causal=causal, window=window, impl=impl)
    assert out.shape == (len(q), H, Dv) and dq.shape == q.shape
    assert dk.shape == k.shape and dv.shape == v.shape
    assert len(ws) == len(lq)
    for s in range(len(lq)):
        a, b = lq[s], lk_[s]
        assert ws[s].shape == (H, a, b)
        if a == 0:
            continue
        keep = structural_keep((H,), a, b, causal=causal, window=window)
        rows = slice(cq[s], cq[s + 1])
        if b == 0:  # no keys: out 0 and dq 0 exactly
            assert np.all(out[rows] == 0) and np.all(dq[rows] == 0)
            continue
        ref_o, ref_w = torch_sdpa(qs[s], ks[s], vs[s], keep=keep)
        check_close("varlen/%s/out" % name, out[rows].transpose(1, 0, 2), ref_o)
        check_close("varlen/%s/weights" % name, ws[s], ref_w)
        _, rq, rk, rv = torch_sdpa_grad(qs[s], ks[s], vs[s], gs[s], keep=keep)
        check_grad("varlen", name, "dq", dq[rows].transpose(1, 0, 2), rq)
        krows = slice(ck[s], ck[s + 1])
        check_grad("varlen", name, "dk", dk[krows].transpose(1, 0, 2), rk)
        check_grad("varlen", name, "dv", dv[krows].transpose(1, 0, 2), rv)


@pytest.mark.parametrize("causal,dropout_p", [(True, 0.0), (False, 0.3),
                                              (True, 0.5)])
def test_vs_padded(causal, dropout_p):
    """The padded batch with key_padding_lengths and the same seed: the
    same rows, the same dropout mask, the same gradients."""
    rng = np.random.default_rng(7)
    lens, H, D = [17, 1, 64, 0, 33], 3, 16
    q, cu, _ = _pack(rng, lens, H, D)
    k, v, g = rand(rng, *q.shape), rand(rng, *q.shape), rand(rng, *q.shape)
    L, N = max(lens), len(lens)

    def pad(x):  # (total, H, D) -> (N, H, L, D), zeros past each length
        y = np.zeros((N, H, L, D), np.float32)
        for s in range(N):
            y[s, :, :lens[s]] = x[cu[s]:cu[s + 1]].transpose(1, 0, 2)
        return y

    kw = dict(is_causal=causal, dropout_p=dropout_p, seed=11, offset=3)
    out = attn.scaled_dot_product_attention_varlen(q, k, v, cu, **kw)
    grads = attn.scaled_dot_product_attention_varlen_grad(g, q, k, v, cu, **kw)
    pq, pk, pv, pg = pad(q), pad(k), pad(v), pad(g)
    pout = attn.scaled_dot_product_attention(pq, pk, pv, key_padding_lengths=lens,
                                             **kw)
    pgrads = attn.scaled_dot_product_attention_grad(pg, pq, pk, pv,
                                                    key_padding_lengths=lens, **kw)
    for s in range(N):
        rows = slice(cu[s], cu[s + 1])
        # same tiles per sequence: bitwise the padded result
        np.testing.assert_array_equal(out[rows], pout[s, :, :lens[s]].transpose(1, 0, 2))
        for a, b in zip(grads, pgrads):
            np.testing.assert_array_equal(a[rows], b[s, :, :lens[s]].transpose(1, 0, 2))


def test_threads_bitwise():
    rng = np.random.default_rng(3)
    lens = [300, 7, 45, 0, 90]
    q, cu, _ = _pack(rng, lens, 2, 24)
    g = rand(rng, *q.shape)
    res = []
    for t in (1, 2, 3):
        kw = dict(is_causal=True, dropout_p=0.2, seed=5, num_threads=t)
        res.append((attn.scaled_dot_product_attention_varlen(q, q, q, cu, **kw),)
                   + attn.scaled_dot_product_attention_varlen_grad(g, q, q, q, cu, **kw))
    for r in res[1:]:
        for a, b in zip(res[0], r):
            assert a.tobytes() == b.tobytes()


def test_inputs_torch_and_strided():
    rng = np.random.default_rng(5)
    lens = [9, 30]
    q, cu, _ = _pack(rng, lens, 2, 8)
    base = attn.scaled_dot_product_attention_varlen(q, q, q, cu)
    qt = torch.from_numpy(q.copy())
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention_varlen(qt, qt, qt, torch.tensor(cu)), base)
    wide = np.zeros((q.shape[0], 2, 16), np.float32)
    wide[:, :, ::2] = q  # every other float: read in place
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention_varlen(wide[:, :, ::2], wide[:, :, ::2],
                                                 wide[:, :, ::2], cu.astype(np.int32)),
        base)
    np.testing.assert_array_equal(  # float64 input: copied to float32
        attn.scaled_dot_product_attention_varlen(q.astype(np.float64), q, q, cu), base)


@pytest.mark.parametrize("cu,status", [
    ([0, 5, 3, 10], "ATTN_ERR_SHAPE"),     # decreasing
    ([1, 5, 10], "ATTN_ERR_SHAPE"),        # does not start at 0
    ([0, 5, 9], "ATTN_ERR_SHAPE"),         # does not end at the total
    ([0, 5, 2**62, 10], "ATTN_ERR_SHAPE"),  # beyond the total
    ([0], "ATTN_ERR_SHAPE"),               # no sequence
    ([], "ATTN_ERR_SHAPE"),
])
def test_bad_cu_seqlens(cu, status):
    q = np.ones((10, 2, 4), np.float32)
    with pytest.raises(attn.AttnError) as e:
        attn.scaled_dot_product_attention_varlen(q, q, q, np.array(cu, np.int64))
    assert e.value.status_name == status


def test_bad_arguments():
    q = np.ones((10, 2, 4), np.float32)
    cu = [0, 4, 10]
    with pytest.raises(ValueError, match="1-D array of integers"):
        attn.scaled_dot_product_attention_varlen(q, q, q, [0.0, 4.5, 10.0])
    with pytest.raises(ValueError, match="one per sequence"):
        attn.scaled_dot_product_attention_varlen(q, q, q, cu, [0, 10])
    with pytest.raises(ValueError, match=r"\(total, H, D\)"):
        attn.scaled_dot_product_attention_varlen(q[0], q[0], q[0], cu)
    with pytest.raises(attn.AttnError, match="k length|cu_seqlens_k"):
        attn.scaled_dot_product_attention_varlen(q, q[:9], q[:9], cu)
    with pytest.raises(ValueError, match="grad_out"):
        attn.scaled_dot_product_attention_varlen_grad(q[:9], q, q, q, cu)
    with pytest.raises(attn.AttnError, match="dropout_p"):
        attn.scaled_dot_product_attention_varlen(q, q, q, cu, dropout_p=1.0)


def test_torch_autograd():
    """attn.torch's varlen through autograd: the functional gradients
    bitwise, and PyTorch's float64 autograd sequence by sequence."""
    import attn.torch as at
    rng = np.random.default_rng(9)
    lens, H, D = [12, 0, 40, 5], 2, 8
    q, cu, qs = _pack(rng, lens, H, D)
    k, _, ks = _pack(rng, lens, H, D)
    v, _, vs = _pack(rng, lens, H, D)
    g, _, gs = _pack(rng, lens, H, D)
    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (q, k, v))
    out = at.scaled_dot_product_attention_varlen(tq, tk, tv, torch.from_numpy(cu),
                                                 is_causal=True)
    out.backward(torch.from_numpy(g))
    ref = attn.scaled_dot_product_attention_varlen_grad(g, q, k, v, cu, is_causal=True)
    for t, r in zip((tq, tk, tv), ref):
        assert t.grad.numpy().tobytes() == r.tobytes()
    np.testing.assert_array_equal(
        out.detach().numpy(), attn.scaled_dot_product_attention_varlen(q, k, v, cu,
                                                                       is_causal=True))
    for s in range(len(lens)):
        if lens[s] == 0:
            continue
        keep = structural_keep((H,), lens[s], lens[s], causal=True)
        o64, rq, rk, rv = torch_sdpa_grad(qs[s], ks[s], vs[s], gs[s], keep=keep)
        rows = slice(cu[s], cu[s + 1])
        check_close("varlen/torch/out", out.detach().numpy()[rows].transpose(1, 0, 2), o64)
        for name, t, r in (("dq", tq, rq), ("dk", tk, rk), ("dv", tv, rv)):
            check_grad("varlen", "torch autograd", name,
                       t.grad.numpy()[rows].transpose(1, 0, 2), r)

"""attn.scaled_dot_product_attention against PyTorch 1.13's math path."""
import math

import numpy as np
import pytest

pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn  # noqa: E402
from _oracle import check_close, rand, structural_keep, torch_sdpa  # noqa: E402


def _run(q, k, v, label, keep=None, add=None, scale=None, **kw):
    """Ours (out and weights) vs the float64 oracle; returns ours."""
    out, w = attn.scaled_dot_product_attention(q, k, v, scale=scale,
                                               need_weights=True, **kw)
    ref_out, ref_w = torch_sdpa(q, k, v, keep=keep, add=add, scale=scale)
    assert out.dtype == np.float32 and w.dtype == np.float32
    check_close("sdpa/%s/out" % label, out, ref_out)
    check_close("sdpa/%s/weights" % label, w, ref_w)
    # weights=False gives the same output
    out2 = attn.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    np.testing.assert_array_equal(out2, out)
    return out, w


# ------------------------------------------------------------------ shapes

SHAPES = [
    # lead, Lq, Lk, Dk, Dv
    ((), 5, 5, 8, 8),
    ((), 1, 1, 4, 4),
    ((3,), 1, 7, 8, 8),
    ((3,), 7, 1, 8, 3),
    ((2, 3), 5, 9, 16, 4),
    ((2, 3), 16, 16, 32, 32),
    ((2, 2, 3), 9, 5, 3, 5),
    ((1, 2, 1, 2), 4, 6, 8, 2),
    ((2, 4), 33, 17, 64, 48),
    ((1,), 1, 64, 16, 16),
]


@pytest.mark.parametrize("lead,Lq,Lk,Dk,Dv", SHAPES)
def test_shapes(lead, Lq, Lk, Dk, Dv):
    rng = np.random.default_rng(hash((lead, Lq, Lk, Dk, Dv)) % 2**32)
    q = rand(rng, *lead, Lq, Dk)
    k = rand(rng, *lead, Lk, Dk)
    v = rand(rng, *lead, Lk, Dv)
    out, w = _run(q, k, v, "shapes")
    assert out.shape == lead + (Lq, Dv)
    assert w.shape == lead + (Lq, Lk)


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes(seed):
    rng = np.random.default_rng(1000 + seed)
    nlead = int(rng.integers(0, 4))
    lead = tuple(int(x) for x in rng.integers(1, 4, size=nlead))
    Lq, Lk = (int(x) for x in rng.integers(1, 40, size=2))
    Dk, Dv = (int(x) for x in rng.integers(1, 40, size=2))
    q = rand(rng, *lead, Lq, Dk, scale=2.0)
    k = rand(rng, *lead, Lk, Dk)
    v = rand(rng, *lead, Lk, Dv)
    _run(q, k, v, "random")


def test_large_scores_stable():
    # scores in the hundreds: a naive exp would overflow
    rng = np.random.default_rng(7)
    q = rand(rng, 2, 2, 8, 16, scale=10.0)
    k = rand(rng, 2, 2, 12, 16, scale=10.0)
    v = rand(rng, 2, 2, 12, 16)
    _run(q, k, v, "large_scores")


# ------------------------------------------------------------------ scale

@pytest.mark.parametrize("scale", [0.3, 2.0, -0.5, 1.0, 0.0])
def test_custom_scale(scale):
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 2, 3, 6, 8), rand(rng, 2, 3, 7, 8), rand(rng, 2, 3, 7, 5)
    out, w = _run(q, k, v, "scale", scale=scale)
    if scale == 0.0:  # explicit zero: uniform weights, not the default scale
        np.testing.assert_allclose(w, 1.0 / 7, rtol=1e-6)


def test_default_scale_is_inv_sqrt_dk():
    rng = np.random.default_rng(12)
    q, k, v = rand(rng, 3, 6, 10), rand(rng, 3, 7, 10), rand(rng, 3, 7, 4)
    a = attn.scaled_dot_product_attention(q, k, v)
    b = attn.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(10))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ causal

@pytest.mark.parametrize("Lq,Lk", [(6, 6), (3, 8), (1, 5), (8, 3), (1, 1)])
def test_causal(Lq, Lk):
    rng = np.random.default_rng(Lq * 100 + Lk)
    lead = (2, 2)
    q, k, v = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8), rand(rng, *lead, Lk, 6)
    keep = structural_keep(lead, Lq, Lk, causal=True)  # j <= i + Lk - Lq
    out, w = _run(q, k, v, "causal", keep=keep, is_causal=True)
    if Lq > Lk:  # the first Lq - Lk queries see no key: zeros, not NaN
        assert np.all(out[..., : Lq - Lk, :] == 0)
        assert np.all(w[..., : Lq - Lk, :] == 0)


def test_causal_equals_explicit_mask():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 4, 5, 8), rand(rng, 4, 9, 8), rand(rng, 4, 9, 8)
    keep = structural_keep((4,), 5, 9, causal=True)
    a = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = attn.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ key padding

@pytest.mark.parametrize("lead", [(), (3,), (3, 2), (3, 2, 2)])
def test_key_padding_lengths(lead):
    rng = np.random.default_rng(21 + len(lead))
    Lq, Lk = 5, 7
    q, k, v = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8), rand(rng, *lead, Lk, 4)
    B = lead[0] if lead else 1
    lengths = [7, 1, 4][:B]
    keep = structural_keep(lead, Lq, Lk, key_lengths=lengths)
    _run(q, k, v, "key_lengths", keep=keep, key_padding_lengths=lengths)


def test_key_padding_length_zero_gives_zero_rows():
    rng = np.random.default_rng(22)
    q, k, v = rand(rng, 2, 3, 4, 8), rand(rng, 2, 3, 6, 8), rand(rng, 2, 3, 6, 8)
    lengths = np.array([0, 6])
    keep = structural_keep((2, 3), 4, 6, key_lengths=lengths)
    out, w = _run(q, k, v, "key_lengths", keep=keep, key_padding_lengths=lengths)
    assert np.all(out[0] == 0) and np.all(w[0] == 0)


# ------------------------------------------------------------------ window

@pytest.mark.parametrize("window,causal", [
    ((2, 0), False), ((None, 1), False), ((1, None), False), ((0, 0), False),
    ((None, None), False), ((3, 3), False), ((2, 5), True), ((None, 2), True),
])
@pytest.mark.parametrize("Lq,Lk", [(8, 8), (4, 10)])
def test_window(window, causal, Lq, Lk):
    rng = np.random.default_rng(31)
    lead = (2, 2)
    q, k, v = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8), rand(rng, *lead, Lk, 8)
    keep = structural_keep(lead, Lq, Lk, causal=causal, window=window)
    _run(q, k, v, "window", keep=keep, window=window, is_causal=causal)


# ------------------------------------------------------------------ masks

MASK_SHAPES = [
    # lead, mask shape (broadcast like torch to lead + (Lq, Lk)); Lq=5, Lk=7
    ((), (5, 7)),
    ((3,), (5, 7)),
    ((3,), (3, 5, 7)),
    ((3,), (3, 1, 7)),
    ((2, 3), (7,)),
    ((2, 3), (1, 7)),
    ((2, 3), (5, 1)),
    ((2, 3), (3, 5, 7)),
    ((2, 3), (2, 1, 1, 7)),
    ((2, 3), (2, 3, 5, 7)),
    ((2, 3), (1, 1, 5, 7)),
    ((2, 3, 2), (3, 1, 5, 7)),   # not mergeable as a stride: copied
    ((2, 3, 2), (2, 1, 2, 5, 7)),
    ((2, 3, 2), (2, 3, 2, 5, 7)),
]


def _keep_mask(rng, shape):
    m = rng.random(shape) < 0.7
    return m


@pytest.mark.parametrize("lead,mshape", MASK_SHAPES)
def test_bool_mask_broadcast(lead, mshape):
    rng = np.random.default_rng(41)
    q, k, v = rand(rng, *lead, 5, 8), rand(rng, *lead, 7, 8), rand(rng, *lead, 7, 3)
    m = _keep_mask(rng, mshape)
    _run(q, k, v, "bool_mask", keep=m, attn_mask=m)


@pytest.mark.parametrize("lead,mshape", MASK_SHAPES)
def test_float_mask_broadcast(lead, mshape):
    rng = np.random.default_rng(42)
    q, k, v = rand(rng, *lead, 5, 8), rand(rng, *lead, 7, 8), rand(rng, *lead, 7, 3)
    m = rand(rng, *mshape)
    m[rng.random(mshape) < 0.2] = -np.inf
    _run(q, k, v, "float_mask", add=m, attn_mask=m)


def test_float64_and_noncontiguous_masks():
    rng = np.random.default_rng(43)
    q, k, v = rand(rng, 2, 3, 5, 8), rand(rng, 2, 3, 7, 8), rand(rng, 2, 3, 7, 8)
    fm = rng.standard_normal((7, 5)).T  # float64, transposed view
    _run(q, k, v, "float_mask", add=fm, attn_mask=fm)
    bm = (rng.random((3, 7, 5)) < 0.6).transpose(0, 2, 1)  # strided bool
    _run(q, k, v, "bool_mask", keep=bm, attn_mask=bm)
    bm2 = (rng.random((5, 14)) < 0.6)[:, ::2]
    _run(q, k, v, "bool_mask", keep=bm2, attn_mask=bm2)
    bm3 = (rng.random((5, 7)) < 0.6)[::-1]  # negative stride: copied
    _run(q, k, v, "bool_mask", keep=bm3, attn_mask=bm3)


def test_fully_masked_rows_are_zero():
    rng = np.random.default_rng(44)
    q, k, v = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 6, 8), rand(rng, 2, 2, 6, 8)
    m = rng.random((2, 2, 4, 6)) < 0.7
    m[0, 1, 2, :] = False
    m[1, :, 0, :] = False
    out, w = _run(q, k, v, "fully_masked", keep=m, attn_mask=m)
    for idx in [(0, 1, 2), (1, 0, 0), (1, 1, 0)]:
        assert np.all(out[idx] == 0) and np.all(w[idx] == 0)
    fm = np.zeros((4, 6), np.float32)
    fm[3, :] = -np.inf
    out, w = _run(q, k, v, "fully_masked", add=fm, attn_mask=fm)
    assert np.all(out[..., 3, :] == 0) and np.all(np.isfinite(out))
    allmask = np.zeros((4, 6), bool)
    out, w = _run(q, k, v, "fully_masked", keep=allmask, attn_mask=allmask)
    assert np.all(out == 0) and np.all(w == 0)


@pytest.mark.parametrize("seed", range(6))
def test_combined_masks(seed):
    rng = np.random.default_rng(50 + seed)
    lead = (3, 2)
    Lq, Lk = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    q, k, v = rand(rng, *lead, Lq, 8), rand(rng, *lead, Lk, 8), rand(rng, *lead, Lk, 5)
    bm = rng.random((3, 1, Lq, Lk)) < 0.8
    fm = rand(rng, Lq, Lk)
    lengths = rng.integers(0, Lk + 1, size=3)
    causal = bool(seed % 2)
    window = [(2, 1), (None, 0), (4, None)][seed % 3]
    keep = bm & structural_keep(lead, Lq, Lk, causal=causal,
                                key_lengths=lengths, window=window)
    _run(q, k, v, "combined", keep=keep, attn_mask=bm,
         is_causal=causal, key_padding_lengths=lengths, window=window)
    # the float mask as attn_mask together with the structural masks
    keep2 = structural_keep(lead, Lq, Lk, causal=causal, key_lengths=lengths,
                            window=window)
    _run(q, k, v, "combined", keep=keep2, add=fm, attn_mask=fm,
         is_causal=causal, key_padding_lengths=lengths, window=window)


# ------------------------------------------------------------------ inputs

def test_strided_inputs_no_copy_needed():
    rng = np.random.default_rng(61)
    B, L, H, D = 2, 6, 3, 8
    packed = rand(rng, B, L, 3, H, D)  # a fused qkv projection's layout
    q = packed[:, :, 0].transpose(0, 2, 1, 3)  # [B, H, L, D] strided views
    k = packed[:, :, 1].transpose(0, 2, 1, 3)
    v = packed[:, :, 2].transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    _run(q, k, v, "strided")
    # the last dim strided too, and float64 / int inputs (converted)
    q2 = rand(rng, 2, 5, 16)[..., ::2]
    _run(q2, k[:, 0, :5], v[:, 0, :5], "strided")
    _run(q.astype(np.float64), k.astype(np.float64), v, "strided")


def test_inputs_not_modified():
    rng = np.random.default_rng(62)
    q, k, v = rand(rng, 2, 5, 8), rand(rng, 2, 6, 8), rand(rng, 2, 6, 8)
    m = rng.random((5, 6)) < 0.5
    copies = [x.copy() for x in (q, k, v, m)]
    attn.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True,
                                      need_weights=True)
    for a, b in zip((q, k, v, m), copies):
        np.testing.assert_array_equal(a, b)


def test_torch_tensors_accepted():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(63)
    q, k, v = rand(rng, 2, 5, 8), rand(rng, 2, 6, 8), rand(rng, 2, 6, 8)
    a = attn.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k),
                                          torch.from_numpy(v))
    np.testing.assert_array_equal(a, attn.scaled_dot_product_attention(q, k, v))


def test_empty_batch():
    q = np.zeros((0, 3, 5, 8), np.float32)
    out, w = attn.scaled_dot_product_attention(q, q, q, need_weights=True)
    assert out.shape == (0, 3, 5, 8) and w.shape == (0, 3, 5, 5)


# ------------------------------------------------------------------ paths

def test_last_path_and_impl():
    rng = np.random.default_rng(71)
    q, k, v = rand(rng, 2, 2, 9, 16), rand(rng, 2, 2, 13, 16), rand(rng, 2, 2, 13, 8)
    m = rng.random((9, 13)) < 0.8
    ref = attn.scaled_dot_product_attention(q, k, v, attn_mask=m, impl="reference")
    name, reason = attn.last_path()
    assert name == "reference" and isinstance(reason, str) and reason
    for impl in ("auto", "fused", None):
        out = attn.scaled_dot_product_attention(q, k, v, attn_mask=m, impl=impl)
        name, reason = attn.last_path()
        assert name in ("reference", "fused"), (name, reason)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, impl="flash")


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_each_path_vs_torch(impl):
    rng = np.random.default_rng(72)
    lead, Lq, Lk = (2, 3), 33, 70
    q, k, v = rand(rng, *lead, Lq, 32), rand(rng, *lead, Lk, 32), rand(rng, *lead, Lk, 24)
    lengths = [50, 70]
    keep = structural_keep(lead, Lq, Lk, causal=True, key_lengths=lengths)
    fm = rand(rng, Lq, Lk)
    _run(q, k, v, "impl_" + impl, keep=keep, add=fm, attn_mask=fm,
         is_causal=True, key_padding_lengths=lengths, impl=impl)


# ------------------------------------------------------------------ threads

def test_threads(restore_threads):
    rng = np.random.default_rng(81)
    q, k, v = rand(rng, 2, 4, 20, 16), rand(rng, 2, 4, 30, 16), rand(rng, 2, 4, 30, 16)
    attn.set_num_threads(1)
    assert attn.get_num_threads() == 1
    a = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    attn.set_num_threads(2)
    assert attn.get_num_threads() == 2
    b = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    c = attn.scaled_dot_product_attention(q, k, v, is_causal=True, num_threads=1)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-7)
    attn.set_num_threads(0)
    assert attn.get_num_threads() >= 1
    with pytest.raises(ValueError):
        attn.set_num_threads(-1)


# ------------------------------------------------------------------ dropout

def test_dropout_is_deterministic_in_seed():
    rng = np.random.default_rng(91)
    q, k, v = rand(rng, 2, 2, 16, 8), rand(rng, 2, 2, 16, 8), rand(rng, 2, 2, 16, 8)
    base, w0 = attn.scaled_dot_product_attention(q, k, v, need_weights=True)
    a, wa = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=3,
                                              need_weights=True)
    if np.array_equal(a, base):
        pytest.skip("dropout not implemented by this libattn yet")
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=3)
    c = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # weights are returned before dropout
    np.testing.assert_allclose(wa, w0, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ errors

def _qkv(lead=(2, 3), Lq=5, Lk=6, Dk=8, Dv=8):
    rng = np.random.default_rng(0)
    return rand(rng, *lead, Lq, Dk), rand(rng, *lead, Lk, Dk), rand(rng, *lead, Lk, Dv)


def test_error_mismatched_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError):  # leading dims
        attn.scaled_dot_product_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError):  # d_k of q vs k: the library's message
        attn.scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError):  # Lk of k vs v
        attn.scaled_dot_product_attention(q, k, v[..., :5, :])
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q[0, 0, 0], k, v)  # 1-D query


def test_error_carries_library_message():
    q, k, v = _qkv()
    with pytest.raises(attn.AttnError) as ei:
        attn.scaled_dot_product_attention(q, k[..., :4], v)
    assert ei.value.status_name.startswith("ATTN_ERR_")
    assert ei.value.library_message and ei.value.library_message in str(ei.value)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("mshape", [(5, 5), (5,), (4, 5, 6), (2, 2, 5, 6), (1, 2, 3, 5, 6)])
def test_error_bad_mask_shape(mshape):
    q, k, v = _qkv()
    for m in (np.ones(mshape, bool), np.zeros(mshape, np.float32)):
        with pytest.raises(ValueError):
            attn.scaled_dot_product_attention(q, k, v, attn_mask=m)


def test_error_bad_mask_dtype():
    q, k, v = _qkv()
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((5, 6), np.int32))


@pytest.mark.parametrize("p", [1.5, -0.1, float("nan")])
def test_error_dropout_p(p):
    q, k, v = _qkv()
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, dropout_p=p)


def test_error_key_padding_lengths():
    q, k, v = _qkv()
    with pytest.raises(ValueError):  # one per batch element (2)
        attn.scaled_dot_product_attention(q, k, v, key_padding_lengths=[1, 2, 3])
    with pytest.raises(ValueError):  # > Lk: the library rejects it
        attn.scaled_dot_product_attention(q, k, v, key_padding_lengths=[7, 1])
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, key_padding_lengths=[-1, 1])
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, key_padding_lengths=[1.5, 1.0])


def test_error_scale_and_window():
    q, k, v = _qkv()
    for s in (float("inf"), float("nan")):
        with pytest.raises(ValueError):
            attn.scaled_dot_product_attention(q, k, v, scale=s)
    for w in (3, (1, 2, 3), (1.5, 2), (-2, 1)):
        with pytest.raises(ValueError):
            attn.scaled_dot_product_attention(q, k, v, window=w)


def test_dropout_exact_semantics(restore_threads):
    # v = identity: out[.., i, j] = weight_ij * keep_ij / (1 - p), so every
    # entry is either 0 or weight / (1 - p), and about p of them are dropped
    rng = np.random.default_rng(92)
    p, Lq, Lk = 0.25, 32, 64
    q, k = rand(rng, 2, 3, Lq, 8), rand(rng, 2, 3, Lk, 8)
    v = np.broadcast_to(np.eye(Lk, dtype=np.float32), (2, 3, Lk, Lk))
    out, w = attn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=11,
                                               need_weights=True)
    if np.allclose(out, w):
        pytest.skip("dropout not implemented by this libattn yet")
    kept = out != 0
    np.testing.assert_allclose(out[kept], w[kept] / (1 - p), rtol=2e-6)
    frac = 1 - kept.mean()
    assert abs(frac - p) < 0.03, frac
    # the same mask for any thread count
    attn.set_num_threads(1)
    out1 = attn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=11)
    np.testing.assert_array_equal(out1 != 0, kept)
    # offset moves the stream
    out2 = attn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=11, offset=1)
    assert not np.array_equal(out2 != 0, kept)

"""attn.torch (libattn inside torch autograd) against PyTorch 1.13 in float64.

Oracles: for scaled_dot_product_attention, torch float64 autograd through
the math path with the rows that see no key given weight 0 instead of NaN
(_oracle.safe_attention); dropout masks come from an independent numpy
Philox-4x32-10 written from attn.h's specification (_oracle.philox_keep).
For MultiheadAttention, torch.nn.MultiheadAttention in float64 holding the
same parameters (and _oracle.torch_mha_functional where torch's module
would give NaN or cannot take the dropout mask).

Tolerances (max |ours - ref| / max |ref|): outputs _oracle.TOL = 1e-5,
gradients _oracle.GRAD_TOL = 1e-4. Ours computes in float32 (unit roundoff
6e-8) with dot products over D and Lk (<= 64 terms here) and the softmax;
the errors measured are around 1e-7 for outputs and 1e-6 for gradients
(pytest's summary prints them), so the tolerances leave 10-100x headroom
for other CPUs' summation orders while any real error (a wrong mask, a
wrong term) is O(1).
"""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")
from torch import nn

import attn
import attn.torch as at
from _oracle import (check_close, check_grad, philox_keep, rand,
                     safe_attention, structural_keep, torch_mha_functional)


@pytest.fixture(autouse=True)
def _torch_seed():
    """Every test draws its torch.randn values from seed 0: reproducible alone
    or in any order."""
    torch.manual_seed(0)


def t32(a, grad=True):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).requires_grad_(grad)


def t64(a, grad=True):
    return torch.from_numpy(np.array(a, dtype=np.float64)).requires_grad_(grad)


# ================================================================== SDPA

def sdpa_vs_oracle(case, q, k, v, keep=None, add=None, scale=None, drop=None,
                   grad=None, **kw):
    """attn.torch's output and q/k/v gradients (for the tensors given with
    requires_grad) vs float64 autograd. q, k, v: float32 torch tensors (any
    strides); keep/add/drop describe kw's masks to the oracle."""
    for x in (q, k, v):
        x.grad = None
    out = at.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    assert out.dtype == torch.float32 and out.shape == q.shape[:-1] + v.shape[-1:]
    Q, K, V = (t64(x.detach().numpy(), x.requires_grad) for x in (q, k, v))
    ref = safe_attention(Q, K, V, keep=keep, add=add, scale=scale, drop=drop)
    check_close("torch_sdpa/%s/out" % case, out.detach().numpy(),
                ref.detach().numpy(), nan_means_zero=False)
    if grad is None:
        grad = torch.randn(out.shape, dtype=torch.float32)
    if not (q.requires_grad or k.requires_grad or v.requires_grad):
        return out
    out.backward(grad)
    ref.backward(grad.double())
    for name, ours, r in (("dq", q, Q), ("dk", k, K), ("dv", v, V)):
        if ours.requires_grad:
            assert ours.grad.shape == ours.shape and ours.grad.dtype == torch.float32
            check_grad("torch_sdpa", case, name, ours.grad.numpy(), r.grad.numpy())
        else:
            assert ours.grad is None
    return out


def masks_for(kind, rng, lead, Lq, Lk):
    """(attn.torch kwargs, oracle keep, oracle add) for one mask kind. The
    masks leave most rows several keys ("empty" makes rows with none): a
    tensor whose rows all see one or two keys has a gradient near 0, and an
    error relative to its max would measure float32 rounding of the scores
    instead."""
    nb = lead[0] if lead else 1
    kw, keep, add = {}, np.ones(tuple(lead) + (Lq, Lk), bool), None
    parts = kind.split("+")
    if "causal" in parts:
        kw["is_causal"] = True
        keep &= structural_keep(lead, Lq, Lk, causal=True)
    if "padding" in parts:
        lengths = rng.integers(max(1, Lk // 2), Lk + 1, size=nb)
        lengths[-1] = max(1, Lk // 2)
        kw["key_padding_lengths"] = torch.from_numpy(lengths)
        keep &= structural_keep(lead, Lq, Lk, key_lengths=lengths)
    if "empty" in parts:  # one batch element sees no key at all
        lengths = np.full(nb, Lk)
        lengths[0] = 0
        kw["key_padding_lengths"] = lengths.tolist()
        keep &= structural_keep(lead, Lq, Lk, key_lengths=lengths)
    if "window" in parts:
        kw["window"] = (4, 1)
        keep &= structural_keep(lead, Lq, Lk, window=(4, 1))
    if "bool" in parts:
        m = rng.random((Lq, Lk)) < 0.7
        kw["attn_mask"] = torch.from_numpy(m)
        keep &= m
    if "add" in parts:
        fm = rand(rng, *lead, Lq, Lk, scale=2.0)
        fm.reshape(-1, Lk)[0, : max(1, Lk // 2)] = -np.inf
        if "bool" in parts:  # both masks: fold the bool one into the additive
            fm = fm + np.where(kw["attn_mask"].numpy(), 0.0, -np.inf).astype(np.float32)
        kw["attn_mask"] = torch.from_numpy(fm)
        add = np.where(np.isfinite(fm), fm, 0.0)
        keep &= np.isfinite(fm)
    return kw, keep, add


MASKS = ["none", "causal", "padding", "window", "bool", "add", "empty",
         "causal+padding", "causal+window+bool", "padding+window+add",
         "causal+padding+window+bool+add"]
SHAPES = [  # lead, Lq, Lk, Dk, Dv
    ((), 6, 6, 8, 8),
    ((3,), 5, 9, 8, 4),
    ((2, 3), 9, 5, 16, 12),
    ((2, 1, 3), 4, 11, 3, 5),
]


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("lead,Lq,Lk,Dk,Dv", SHAPES)
def test_sdpa_masks_shapes(kind, lead, Lq, Lk, Dk, Dv):
    rng = np.random.default_rng(zlib.crc32(repr((kind, lead, Lq)).encode()))
    q = t32(rand(rng, *lead, Lq, Dk))
    k = t32(rand(rng, *lead, Lk, Dk))
    v = t32(rand(rng, *lead, Lk, Dv))
    kw, keep, add = masks_for(kind, rng, lead, Lq, Lk)
    sdpa_vs_oracle(kind, q, k, v, keep=keep, add=add, **kw)
    assert at._last_copied() == ()  # contiguous inputs are read in place
    empty = ~keep.any(-1)
    if empty.any():  # rows that see no key: output 0 and zero dq
        assert np.all(q.grad.numpy()[empty] == 0)


def test_sdpa_bool_and_float_mask_dtypes():
    rng = np.random.default_rng(3)
    q, k, v = (t32(rand(rng, 2, 3, 5, 8)) for _ in range(3))
    fm = rand(rng, 3, 5, 5)
    # a float64 additive mask is rounded to float32, as the scores are
    sdpa_vs_oracle("mask64", q, k, v, add=fm.astype(np.float32),
                   attn_mask=torch.from_numpy(fm.astype(np.float64)))
    bm = rng.random((2, 1, 5, 5)) < 0.5
    sdpa_vs_oracle("mask_b1", q, k, v, keep=bm, attn_mask=torch.from_numpy(bm))


@pytest.mark.parametrize("scale", [0.3, -0.7, 0.0])
def test_sdpa_scale(scale):
    rng = np.random.default_rng(5)
    q, k = t32(rand(rng, 2, 4, 8)), t32(rand(rng, 2, 6, 8))
    v = t32(rand(rng, 2, 6, 3))
    sdpa_vs_oracle("scale", q, k, v, scale=scale)
    if scale == 0.0:
        assert torch.all(q.grad == 0) and torch.all(k.grad == 0)


def test_sdpa_noncontiguous_inputs():
    rng = np.random.default_rng(7)
    B, H, L, D = 2, 3, 7, 8
    # [B, L, H, D] projections seen as [B, H, L, D]: a transpose, no copy
    base = t32(rand(rng, B, L, H, 2 * D), grad=False)
    q = base[..., :D].transpose(1, 2).requires_grad_(False)
    q = q.detach().requires_grad_(True)
    kb = t32(rand(rng, B, H, 2 * L, D), grad=False)
    k = kb[:, :, ::2].detach().requires_grad_(True)      # every other key
    vb = t32(rand(rng, B, H, D, L), grad=False)
    v = vb.transpose(-1, -2).detach().requires_grad_(True)  # column-major V
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    keep = structural_keep((B, H), L, L, causal=True)
    out = sdpa_vs_oracle("strided", q, k, v, keep=keep, is_causal=True)
    assert at._last_copied() == ()
    # the same numbers as contiguous copies give, bit for bit
    qc, kc, vc = (x.detach().contiguous() for x in (q, k, v))
    assert torch.equal(out, at.scaled_dot_product_attention(qc, kc, vc, is_causal=True))

    # leading dims that no single stride describes (H before B in memory):
    # copied, with the right result
    qp = t32(rand(rng, B, 3, 2, L, D), grad=False).permute(0, 2, 1, 3, 4)
    qp = qp.detach().requires_grad_(True)
    kp, vp = (t32(rand(rng, B, 2, 3, L, D)) for _ in range(2))
    sdpa_vs_oracle("strided", qp, kp, vp)
    assert at._last_copied() == ("query",)
    # a broadcast (stride 0) value
    kp, vp = (t32(rand(rng, B, H, L, D)) for _ in range(2))
    ve = t32(rand(rng, 1, 1, L, D), grad=False).expand(B, H, L, D).detach().requires_grad_(True)
    sdpa_vs_oracle("strided", kp, vp, ve)
    assert at._last_copied() == ()


def test_sdpa_noncontiguous_grad_out():
    torch.manual_seed(9)
    rng = np.random.default_rng(9)
    q, k, v = (t32(rand(rng, 2, 5, 6)) for _ in range(3))
    out = at.scaled_dot_product_attention(q, k, v)
    out.sum().backward()  # grad_out is an expanded (stride 0) tensor
    Q, K, V = (t64(x.detach().numpy()) for x in (q, k, v))
    safe_attention(Q, K, V).sum().backward()
    for name, a, b in (("dq", q, Q), ("dk", k, K), ("dv", v, V)):
        check_grad("torch_sdpa", "grad_out_stride0", name, a.grad.numpy(), b.grad.numpy())
    for x in (q, k, v):
        x.grad = None
    g = torch.randn(2, 6, 5).transpose(1, 2)  # transposed grad_out
    at.scaled_dot_product_attention(q, k, v).backward(g)
    Q, K, V = (t64(x.detach().numpy()) for x in (q, k, v))
    safe_attention(Q, K, V).backward(g.double())
    check_grad("torch_sdpa", "grad_out_transposed", "dq", q.grad.numpy(), Q.grad.numpy())


@pytest.mark.parametrize("which", ["q", "k", "v", "kv", "none"])
def test_sdpa_requires_grad_subset(which):
    rng = np.random.default_rng(11)
    q = t32(rand(rng, 2, 2, 5, 8), "q" in which)
    k = t32(rand(rng, 2, 2, 7, 8), "k" in which)
    v = t32(rand(rng, 2, 2, 7, 4), "v" in which)
    out = sdpa_vs_oracle("subset_" + which, q, k, v, is_causal=True,
                         keep=structural_keep((2, 2), 5, 7, causal=True))
    assert out.requires_grad == (which != "none")


def test_sdpa_thread_count_bitwise():
    rng = np.random.default_rng(13)
    q, k, v = (t32(rand(rng, 2, 4, 70, 16)) for _ in range(3))
    res = []
    n = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for x in (q, k, v):
                x.grad = None
            out = at.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.2, seed=4)
            out.backward(torch.ones_like(out))
            res.append([out.detach().clone()] + [x.grad.clone() for x in (q, k, v)])
    finally:
        torch.set_num_threads(n)
    for a, b in zip(*res):
        assert torch.equal(a, b)


# ------------------------------------------------------------ dropout

@pytest.mark.parametrize("p", [0.1, 0.5])
def test_sdpa_dropout_vs_oracle(p):
    """The forward's mask is attn.h's Philox mask, and the backward uses it:
    output and gradients match float64 autograd with that mask applied."""
    rng = np.random.default_rng(17)
    lead, Lq, Lk = (2, 3), 6, 9
    q, k = t32(rand(rng, *lead, Lq, 8)), t32(rand(rng, *lead, Lk, 8))
    v = t32(rand(rng, *lead, Lk, 5))
    seed, offset = 1234, 7
    drop = philox_keep(2, 3, Lq, Lk, p, seed, offset) / (1.0 - p)
    keep = structural_keep(lead, Lq, Lk, causal=True)
    sdpa_vs_oracle("dropout_p%g" % p, q, k, v, keep=keep, drop=drop,
                   is_causal=True, dropout_p=p, seed=seed, offset=offset)
    # the numpy binding, given the same seed, gives the same gradients
    g = np.ones((2, 3, Lq, 5), np.float32)
    for x in (q, k, v):
        x.grad = None
    at.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p,
                                    seed=seed, offset=offset).backward(torch.from_numpy(g))
    ref = attn.scaled_dot_product_attention_grad(
        g, q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
        is_causal=True, dropout_p=p, seed=seed, offset=offset)
    for x, r in zip((q, k, v), ref):
        np.testing.assert_array_equal(x.grad.numpy(), r)


def test_sdpa_dropout_reproducible():
    rng = np.random.default_rng(19)
    q, k, v = (t32(rand(rng, 2, 2, 16, 8), grad=False) for _ in range(3))
    f = lambda **kw: at.scaled_dot_product_attention(q, k, v, dropout_p=0.3, **kw)  # noqa: E731
    assert torch.equal(f(seed=5), f(seed=5))
    assert not torch.equal(f(seed=5), f(seed=6))
    assert not torch.equal(f(seed=5), f(seed=5, offset=1))
    torch.manual_seed(42)
    a = f()
    torch.manual_seed(42)
    assert torch.equal(a, f())  # seed=None draws from torch's generator
    assert not torch.equal(a, f())
    # dropout_p = 0 is an exact no-op, whatever the seed
    assert torch.equal(at.scaled_dot_product_attention(q, k, v, seed=9),
                       at.scaled_dot_product_attention(q, k, v))


# ------------------------------------------------------------ refusals

def test_sdpa_double_backward_refused():
    rng = np.random.default_rng(23)
    q, k, v = (t32(rand(rng, 2, 4, 8)) for _ in range(3))
    out = at.scaled_dot_product_attention(q, k, v)
    # first-order gradients with create_graph=True still work...
    dq, = torch.autograd.grad(out.sum(), q, create_graph=True)
    Q, K, V = (t64(x.detach().numpy()) for x in (q, k, v))
    safe_attention(Q, K, V).sum().backward()
    check_grad("torch_sdpa", "create_graph", "dq", dq.detach().numpy(), Q.grad.numpy())
    assert dq.requires_grad  # ...but are never silently constant
    with pytest.raises(at.UnsupportedError, match="double backward"):
        dq.sum().backward()
    # a second-order term mixed into another loss is refused too
    out = at.scaled_dot_product_attention(q, k, v)
    dv, = torch.autograd.grad(out.pow(2).sum(), v, create_graph=True)
    with pytest.raises(at.UnsupportedError, match="math path"):
        (out.sum() + dv.norm()).backward()


def test_sdpa_unsupported_inputs():
    x = torch.randn(2, 4, 8)
    for dt in (torch.float64, torch.float16, torch.int32):  # bfloat16: test_bf16.py
        with pytest.raises(at.UnsupportedError, match=r"float32 only.*\.float\(\)"):
            at.scaled_dot_product_attention(x.to(dt), x, x)
    meta = torch.empty(2, 4, 8, device="meta")
    with pytest.raises(at.UnsupportedError, match=r"CPU only.*\.cpu\(\)"):
        at.scaled_dot_product_attention(x, meta, x)
    with pytest.raises(at.UnsupportedError, match="to_dense"):
        at.scaled_dot_product_attention(x, x, x.to_sparse())
    with pytest.raises(TypeError, match="torch.Tensor"):
        at.scaled_dot_product_attention(x.numpy(), x, x)
    fm = torch.zeros(4, 4, requires_grad=True)
    with pytest.raises(at.UnsupportedError, match=r"attn_mask.detach\(\)"):
        at.scaled_dot_product_attention(x, x, x, attn_mask=fm)
    with pytest.raises(ValueError, match="bool or floating"):
        at.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(4, 4, dtype=torch.int64))


def test_sdpa_bad_arguments():
    x = torch.randn(2, 4, 8)  # values do not matter here
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        at.scaled_dot_product_attention(x, x, x, dropout_p=1.0)
    with pytest.raises(ValueError, match="same leading dims"):
        at.scaled_dot_product_attention(x, torch.randn(3, 4, 8), x)
    with pytest.raises(ValueError, match="head size"):
        at.scaled_dot_product_attention(x, torch.randn(2, 4, 7), x)
    with pytest.raises(ValueError, match="does not broadcast"):
        at.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_lengths"):
        at.scaled_dot_product_attention(x, x, x, key_padding_lengths=[1, 5])
    with pytest.raises(ValueError, match="at least 2 dims"):
        at.scaled_dot_product_attention(torch.randn(8), x, x)


def test_sdpa_empty_output():
    q = torch.randn(2, 0, 8, requires_grad=True)
    k = torch.randn(2, 5, 8, requires_grad=True)
    v = torch.randn(2, 5, 3, requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 0, 3)
    out.sum().backward()
    assert torch.all(k.grad == 0) and torch.all(v.grad == 0) and q.grad.shape == q.shape


def test_sdpa_in_place_change_is_detected():
    """attn reads the inputs' memory in place, so an in-place change between
    forward and backward must raise (torch's version check), not give
    gradients of other numbers."""
    q, k, v = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
    kk = k * 1.0
    out = at.scaled_dot_product_attention(q, kk, v)
    kk.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_import_attn_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import attn, numpy as np\n"
            "x = np.ones((2, 3, 4), np.float32)\n"
            "print(attn.scaled_dot_product_attention(x, x, x).shape)\n"
            "try:\n    import attn.torch\nexcept ImportError as e:\n    print('ImportError')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(attn.__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(2,", "3,", "4)", "ImportError"]


# ================================================================== MHA

def mha_pair(E, H, seed=0, randomize=True, **kw):
    """(ours, torch float64 module holding the same parameters)."""
    torch.manual_seed(seed)
    ours = at.MultiheadAttention(E, H, **kw)
    if randomize:  # biases too (torch's init leaves them 0)
        with torch.no_grad():
            for p in ours.parameters():
                p.copy_(torch.randn(p.shape) * 0.3)
    ref = nn.MultiheadAttention(E, H, dtype=torch.float64, **kw)
    ref.load_state_dict({n: t.double() for n, t in ours.state_dict().items()})
    return ours, ref


def mha_compare(case, ours, ref, q, k, v, self_attn=False, grad_weights=False, **fkw):
    """Forward both modules (ours on float32 copies of the float64 inputs),
    backward the same random grad_out, compare out, weights and every
    gradient. k/v None: self-attention (or key is value when v is None)."""
    ours.zero_grad()
    ref.zero_grad()
    Q = t64(q)
    K = Q if k is None else t64(k)
    V = K if v is None else t64(v)
    q32 = t32(q)
    k32 = q32 if k is None else t32(k)
    v32 = k32 if v is None else t32(v)
    rkw = {n: (m.double() if isinstance(m, torch.Tensor) and m.is_floating_point() else m)
           for n, m in fkw.items()}
    out, w = ours(q32, k32, v32, **fkw)
    rout, rw = ref(Q, K, V, **rkw)
    assert out.shape == rout.shape and out.dtype == torch.float32
    check_close("torch_mha/%s/out" % case, out.detach().numpy(), rout.detach().numpy())
    if rw is None:
        assert w is None
    else:
        assert w.shape == rw.shape
        check_close("torch_mha/%s/weights" % case, w.detach().numpy(), rw.detach().numpy())
    g = torch.randn(out.shape, dtype=torch.float64)
    out.backward(g.float())
    rout.backward(g)
    names = ["d_query"] + ([] if k is None else ["d_key"]) + ([] if v is None else ["d_value"])
    for name, a, b in zip(names, (q32, k32, v32), (Q, K, V)):
        check_grad("torch_mha", case, name, a.grad.numpy(), b.grad.numpy())
    rp = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        check_grad("torch_mha", case, n, p.grad.numpy(), rp[n].grad.numpy())
    return out, w


def x_(rng, *shape):
    return rand(rng, *shape)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_self_attention(batch_first, bias):
    rng = np.random.default_rng(31)
    ours, ref = mha_pair(16, 4, bias=bias, batch_first=batch_first)
    shape = (3, 7, 16) if batch_first else (7, 3, 16)
    mha_compare("self_bf%d_b%d" % (batch_first, bias), ours, ref, x_(rng, *shape), None, None)


@pytest.mark.parametrize("kdim,vdim", [(None, None), (10, 6), (16, 12)])
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_cross_attention(kdim, vdim, batch_first):
    rng = np.random.default_rng(37)
    E = 16
    ours, ref = mha_pair(E, 2, kdim=kdim, vdim=vdim, batch_first=batch_first)
    B, Lq, Lk = 2, 5, 9
    kd, vd = kdim or E, vdim or E

    def sh(L, d):
        return (B, L, d) if batch_first else (L, B, d)
    mha_compare("cross_%s_%s" % (kdim, vdim), ours, ref, x_(rng, *sh(Lq, E)),
                x_(rng, *sh(Lk, kd)), x_(rng, *sh(Lk, vd)))
    if kdim is None:  # key is value (encoder memory): summed gradient
        mha_compare("cross_key_is_value", ours, ref, x_(rng, *sh(Lq, E)),
                    x_(rng, *sh(Lk, E)), None)


@pytest.mark.parametrize("average", [True, False])
def test_mha_weights_and_unbatched(average):
    rng = np.random.default_rng(41)
    ours, ref = mha_pair(12, 3)
    _, w = mha_compare("unbatched", ours, ref, x_(rng, 6, 12), x_(rng, 8, 12), x_(rng, 8, 12),
                       average_attn_weights=average)
    assert w.shape == ((6, 8) if average else (3, 6, 8))
    out, w = mha_compare("no_weights", ours, ref, x_(rng, 4, 2, 12), None, None,
                         need_weights=False)
    assert w is None


def kpm_prefix(B, Lk, lengths):
    return torch.arange(Lk)[None, :] >= torch.tensor(lengths)[:, None]  # True = ignore


@pytest.mark.parametrize("case", [
    "kpm_prefix", "kpm_scattered", "kpm_float", "causal_bool", "causal_float",
    "bool2d", "bool3d", "float2d", "float3d", "uint8", "causal+kpm", "bool+float_kpm",
    "is_causal", "is_causal+kpm"])
def test_mha_masks(case):
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    E, H, B, L = 16, 4, 3, 7
    ours, ref = mha_pair(E, H, batch_first=True)
    x = x_(rng, B, L, E)
    causal_b = torch.ones(L, L, dtype=torch.bool).triu(1)  # True = not allowed
    kw = {}
    if "kpm" in case.split("+")[-1] or case.startswith("kpm"):
        kw["key_padding_mask"] = kpm_prefix(B, L, [7, 3, 5])
    if case == "kpm_scattered":
        m = torch.from_numpy(rng.random((B, L)) < 0.3)
        m[:, 0] = False  # every query keeps a key: torch would give NaN
        kw["key_padding_mask"] = m
    if case in ("kpm_float", "bool+float_kpm"):
        kw["key_padding_mask"] = torch.from_numpy(rand(rng, B, L))
    if case.startswith("causal"):
        kw["attn_mask"] = (causal_b if case != "causal_float" else
                           torch.zeros(L, L).masked_fill(causal_b, float("-inf")))
    if case in ("bool2d", "bool+float_kpm", "uint8"):
        m = torch.from_numpy(rng.random((L, L)) < 0.4)
        m.fill_diagonal_(False)
        kw["attn_mask"] = m.to(torch.uint8) if case == "uint8" else m
    if case == "bool3d":
        m = torch.from_numpy(rng.random((B * H, L, L)) < 0.4)
        m[:, :, 0] = False
        kw["attn_mask"] = m
    if case == "float2d":
        kw["attn_mask"] = torch.from_numpy(rand(rng, L, L))
    if case == "float3d":
        kw["attn_mask"] = torch.from_numpy(rand(rng, B * H, L, L))
    if case.startswith("is_causal"):
        # torch 1.13's module has no is_causal: the reference gets the mask
        out, _ = ours(t32(x), t32(x), t32(x), is_causal=True, need_weights=False,
                      key_padding_mask=kw.get("key_padding_mask"))
        rout, _ = ref(t64(x), t64(x), t64(x), attn_mask=causal_b, need_weights=False,
                      key_padding_mask=kw.get("key_padding_mask"))
        check_close("torch_mha/is_causal/out", out.detach().numpy(), rout.detach().numpy())
        return
    if case == "bool+float_kpm":
        # torch 1.13 ORs a float key_padding_mask into a bool attn_mask (every
        # nonzero entry masks the key: NaN rows); the oracle is the float64
        # functional form with the bool mask kept and the float one added
        X = t32(x)
        out, _ = ours(X, X, X, need_weights=False, **kw)
        X64 = t64(x)
        params = {n.replace(".", "_"): t64(p.detach().numpy()) for n, p in ours.named_parameters()}
        rout = torch_mha_functional(params, E, H, X64, X64, X64,
                                    keep=(~kw["attn_mask"]).numpy(),
                                    add=kw["key_padding_mask"].numpy()[:, None, None, :])
        check_close("torch_mha/%s/out" % case, out.detach().numpy(), rout.detach().numpy())
        return
    if case == "uint8":
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: byte masks are deprecated
            mha_compare(case, ours, ref, x, None, None, **kw)
        return
    mha_compare(case, ours, ref, x, None, None, **kw)


def test_mha_fully_masked_rows_give_zero_attention():
    """A query that sees no key: torch gives NaN; attn gives attention 0, so
    the output is out_proj.bias, with finite gradients (oracle: the float64
    functional form with such rows' weights 0)."""
    rng = np.random.default_rng(43)
    E, H, B, L = 8, 2, 2, 5
    ours, _ = mha_pair(E, H, batch_first=True)
    x = x_(rng, B, L, E)
    kpm = kpm_prefix(B, L, [5, 0])  # batch 1 sees no key
    X = t32(x)
    out, _ = ours(X, X, X, key_padding_mask=kpm, need_weights=False)
    assert torch.allclose(out[1], ours.out_proj.bias.expand(L, E))
    X64 = t64(x)
    params = {n.replace(".", "_"): t64(p.detach().numpy()) for n, p in ours.named_parameters()}
    keep = (~kpm).numpy()[:, None, None, :]
    rout = torch_mha_functional(params, E, H, X64, X64, X64, keep=keep)
    check_close("torch_mha/empty_rows/out", out.detach().numpy(), rout.detach().numpy())
    g = torch.randn(out.shape)
    out.backward(g)
    rout.backward(g.double())
    check_grad("torch_mha", "empty_rows", "d_query", X.grad.numpy(), X64.grad.numpy())
    for n, p in ours.named_parameters():
        check_grad("torch_mha", "empty_rows", n, p.grad.numpy(),
                   params[n.replace(".", "_")].grad.numpy())


@pytest.mark.parametrize("self_attn", [True, False])
def test_mha_dropout_vs_oracle(self_attn):
    """Training mode with dropout: the seed comes from torch's generator, the
    mask is attn.h's Philox mask, and the backward uses the forward's mask."""
    rng = np.random.default_rng(47)
    E, H, B, Lq, Lk, p = 16, 4, 2, 6, 8, 0.25
    ours, _ = mha_pair(E, H, dropout=p, batch_first=True)
    q = t32(x_(rng, B, Lq, E))
    k = q if self_attn else t32(x_(rng, B, Lk, E))
    Lk = Lq if self_attn else Lk
    torch.manual_seed(99)
    seed = at._draw_seed()  # what the module draws after manual_seed(99)
    torch.manual_seed(99)
    out, _ = ours(q, k, k, need_weights=False)
    torch.manual_seed(99)
    again, _ = ours(q.detach(), k.detach(), k.detach(), need_weights=False)
    assert torch.equal(out, again)
    params = {n.replace(".", "_"): t64(t.detach().numpy()) for n, t in ours.named_parameters()}
    Q = t64(q.detach().numpy())
    K = Q if self_attn else t64(k.detach().numpy())
    drop = philox_keep(B, H, Lq, Lk, p, seed, 0) / (1.0 - p)
    rout = torch_mha_functional(params, E, H, Q, K, K, drop=drop)
    check_close("torch_mha/dropout/out", out.detach().numpy(), rout.detach().numpy())
    g = torch.randn(out.shape)
    out.backward(g)
    rout.backward(g.double())
    check_grad("torch_mha", "dropout", "d_query", q.grad.numpy(), Q.grad.numpy())
    for n, t in ours.named_parameters():
        check_grad("torch_mha", "dropout", n, t.grad.numpy(), params[n.replace(".", "_")].grad.numpy())
    ours.eval()  # eval: no dropout, equal to torch's module
    _, ref = mha_pair(E, H, dropout=p, batch_first=True)
    ref.eval()
    mha_compare("eval_no_dropout", ours, ref, x_(rng, B, Lq, E), None, None)


def test_mha_state_dict_round_trip():
    for kw in ({}, {"bias": False}, {"kdim": 6, "vdim": 10}, {"kdim": 6, "bias": False}):
        torch.manual_seed(3)
        ref = nn.MultiheadAttention(12, 3, **kw)
        torch.manual_seed(3)
        ours = at.MultiheadAttention(12, 3, **kw)
        sd, rsd = ours.state_dict(), ref.state_dict()
        assert list(sd) == list(rsd), kw
        for n in rsd:  # same init from the same seed
            assert sd[n].shape == rsd[n].shape and torch.equal(sd[n], rsd[n]), (kw, n)
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
        with torch.no_grad():
            for t in ref.parameters():
                t.normal_()
        ours.load_state_dict(ref.state_dict())  # torch -> ours, strict
        for n, t in ref.state_dict().items():
            assert torch.equal(ours.state_dict()[n], t)
        with torch.no_grad():
            for t in ours.parameters():
                t.normal_()
        ref.load_state_dict(ours.state_dict())  # ours -> torch, strict
        for n, t in ours.state_dict().items():
            assert torch.equal(ref.state_dict()[n], t)


def test_mha_replaces_torch_module_in_a_model():
    """torch.nn.TransformerEncoderLayer with its self_attn swapped for ours
    (loaded from the original's state_dict): same outputs and gradients."""
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    swapped = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    swapped.load_state_dict(layer.state_dict())
    mine = at.MultiheadAttention(16, 4, batch_first=True)
    mine.load_state_dict(layer.self_attn.state_dict())
    swapped.self_attn = mine
    assert set(swapped.state_dict()) == set(layer.state_dict())
    x = torch.randn(3, 9, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(9)
    kpm = kpm_prefix(3, 9, [9, 4, 6])
    a = layer(x, src_mask=mask, src_key_padding_mask=kpm)
    b = swapped(x, src_mask=mask, src_key_padding_mask=kpm)
    assert torch.allclose(a, b, rtol=0, atol=2e-6), (a - b).abs().max()
    a.sum().backward()
    b.sum().backward()
    ga = dict(layer.named_parameters())
    for n, t in swapped.named_parameters():
        assert torch.allclose(t.grad, ga[n].grad, rtol=0, atol=2e-5), n


def test_mha_inference_path_matches_training_path():
    rng = np.random.default_rng(53)
    ours, _ = mha_pair(16, 4, batch_first=True)
    x = t32(x_(rng, 2, 6, 16))
    out, w = ours(x, x, x)
    with torch.no_grad():
        out2, w2 = ours(x, x, x)
    assert not out2.requires_grad
    assert torch.equal(out.detach(), out2) and torch.equal(w.detach(), w2)


def test_mha_refusals():
    with pytest.raises(at.UnsupportedError, match="add_bias_kv.*torch.nn.MultiheadAttention"):
        at.MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(at.UnsupportedError, match="add_zero_attn.*torch.nn.MultiheadAttention"):
        at.MultiheadAttention(8, 2, add_zero_attn=True)
    with pytest.raises(at.UnsupportedError, match="float32 only"):
        at.MultiheadAttention(8, 2, dtype=torch.float64)
    with pytest.raises(at.UnsupportedError, match="CPU only"):
        at.MultiheadAttention(8, 2, device="meta")
    with pytest.raises(ValueError, match="not divisible"):
        at.MultiheadAttention(10, 4)
    m = at.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8, requires_grad=True)
    with pytest.raises(at.UnsupportedError, match=r"float32 only.*\.float\(\)"):
        m(x.double(), x.double(), x.double())
    md = at.MultiheadAttention(8, 2).double()
    with pytest.raises(at.UnsupportedError, match="parameter in_proj_weight.*float64"):
        md(x, x, x)
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        m(x, x, x, attn_mask=torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        m(x, x, x, key_padding_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="embed_dim=8"):
        m(torch.randn(2, 3, 7), x, x)
    # gradients through the returned weights are refused, not dropped
    out, w = m(x, x, x)
    with pytest.raises(at.UnsupportedError, match=r"weights.detach\(\)"):
        (out.sum() + w.pow(2).sum()).backward()
    # double backward refused
    out, _ = m(x, x, x, need_weights=False)
    dx, = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    with pytest.raises(at.UnsupportedError, match="double backward"):
        dx.sum().backward()


def test_sdpa_self_attention_same_tensor():
    """q, k and v the same tensor: its gradient is the sum of the three."""
    rng = np.random.default_rng(59)
    x = t32(rand(rng, 2, 3, 6, 8))
    out = at.scaled_dot_product_attention(x, x, x, is_causal=True)
    X = t64(x.detach().numpy())
    ref = safe_attention(X, X, X, keep=structural_keep((2, 3), 6, 6, causal=True))
    g = torch.randn(out.shape)
    out.backward(g)
    ref.backward(g.double())
    check_grad("torch_sdpa", "same_tensor", "dx", x.grad.numpy(), X.grad.numpy())


def test_molgen_twin_with_attn_attention():
    """molgen.torch_model's hook (bench --attn): the twin built with
    attn.torch.MultiheadAttention has torch's init and gives the plain
    twin's loss and gradients (float32 both; the difference is rounding)."""
    from molgen import torch_model as tm
    cfg = tm.Config(n_layer=2, d_model=32, n_head=4, ctx_len=12, vocab_size=11)
    torch.manual_seed(0)
    plain = tm.MolGPT(cfg)
    torch.manual_seed(0)
    mine = tm.MolGPT(cfg, at.MultiheadAttention)
    assert isinstance(mine.blocks[0].attn, at.MultiheadAttention)
    assert list(plain.state_dict()) == list(mine.state_dict())
    for (n, a), (_, b) in zip(plain.state_dict().items(), mine.state_dict().items()):
        assert torch.equal(a, b), n
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 11, (4, 13), generator=g)
    lengths = torch.tensor([13, 7, 10, 3])
    la, _ = plain.loss(ids, lengths)
    lb, _ = mine.loss(ids, lengths)
    assert abs(float(la) - float(lb)) < 1e-5
    la.backward()
    lb.backward()
    pb = dict(mine.named_parameters())
    for n, p in plain.named_parameters():
        err = float((p.grad - pb[n].grad).abs().max() / p.grad.abs().max().clamp_min(1e-30))
        assert err < 1e-4, (n, err)


@pytest.mark.parametrize("zero", ["B", "H", "Lq", "Lk", "Dk", "Dv"])
def test_sdpa_zero_size_dims(zero):
    """attn's zero-size rule is PyTorch 1.13's result: compared with the
    plain float64 math path and its autograd (which needs no NaN guard
    here: with Lk = 0 its softmax is over no key, with Dk = 0 every score
    is 0)."""
    torch.manual_seed(0)
    d = dict(B=2, H=3, Lq=4, Lk=5, Dk=6, Dv=7)
    d[zero] = 0
    q = torch.randn(d["B"], d["H"], d["Lq"], d["Dk"], requires_grad=True)
    k = torch.randn(d["B"], d["H"], d["Lk"], d["Dk"], requires_grad=True)
    v = torch.randn(d["B"], d["H"], d["Lk"], d["Dv"], requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, v, scale=0.5)
    Q, K, V = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    ref = torch.softmax(Q @ K.transpose(-2, -1) * 0.5, -1) @ V
    assert out.shape == ref.shape
    g = torch.randn(out.shape)
    (out * g).sum().backward()
    (ref * g.double()).sum().backward()
    check_close("torch_sdpa/zero_%s/out" % zero, out.detach().numpy(), ref.detach().numpy(),
                nan_means_zero=False)
    for name, a, b in (("dq", q, Q), ("dk", k, K), ("dv", v, V)):
        assert a.grad.shape == a.shape
        check_grad("torch_sdpa", "zero_" + zero, name, a.grad.numpy(), b.grad.numpy())


@pytest.mark.parametrize("zero", ["B", "Lq", "Lk"])
def test_mha_zero_size(zero):
    """Zero batch or length: PyTorch's result (empty output, or
    out_proj.bias when Lk = 0) and its gradients (zeros; out_proj.bias gets
    the sum of grad_out when Lk = 0)."""
    d = dict(B=2, Lq=3, Lk=4)
    d[zero] = 0
    rng = np.random.default_rng(61)
    ours, ref = mha_pair(8, 2, batch_first=True)
    out, w = mha_compare("zero_" + zero, ours, ref, x_(rng, d["B"], d["Lq"], 8),
                         x_(rng, d["B"], d["Lk"], 8), None)
    assert out.shape == (d["B"], d["Lq"], 8) and w.shape == (d["B"], d["Lq"], d["Lk"])

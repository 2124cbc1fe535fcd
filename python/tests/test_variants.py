"""The attention variants (enable_gqa, softcap, alibi_slopes, sinks) through
attn.torch and attn (numpy) against a PyTorch 1.13 math reference (it has no
enable_gqa: K/V repeated with repeat_interleave; an explicit tanh, the ALiBi
bias and an extra softmax column for the sink).

Rule (FlashAttention's): error vs the float64 math path <= 2x the math
path's own error in the same dtype + 1e-5 (float32) or 1e-3 (bfloat16),
for the output and every gradient (q, k, v, sinks). Errors are
max |x - ref64| / max |ref64|.
"""
import itertools

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
import attn.torch as at


def math_sdpa(q, k, v, *, causal=False, mask=None, key_lengths=None, window=None,
              gqa=False, softcap=None, slopes=None, sinks=None):
    """The reference in q's dtype (torch ops): rows without a visible key give 0."""
    if gqa:
        r = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(r, -3), v.repeat_interleave(r, -3)
    s = q @ k.transpose(-1, -2) * (1.0 / q.shape[-1] ** 0.5)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    Lq, Lk = s.shape[-2:]
    i = torch.arange(Lq)[:, None] + (Lk - Lq)
    j = torch.arange(Lk)[None, :]
    if slopes is not None:
        s = s - torch.as_tensor(slopes, dtype=s.dtype)[:, None, None] * (i - j).abs().to(s.dtype)
    keep = torch.ones(s.shape, dtype=torch.bool)
    if causal:
        keep = keep & (j <= i)
    if window is not None:
        keep = keep & (j >= i - window[0]) & (j <= i + window[1])
    if key_lengths is not None:
        kl = torch.as_tensor(key_lengths)[:, None, None, None]
        keep = keep & (j < kl)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask.to(s.dtype)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        col = sinks.to(s.dtype)[:, None, None].expand(*s.shape[:-1], 1)
        s = torch.cat([s, col], -1)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    p = e / torch.where(z > 0, z, torch.ones_like(z))  # a row with no key (no sink): 0
    if sinks is not None:
        p = p[..., :-1]
    return p @ v


def rel(x, ref):
    ref = ref.double()
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


MASKS = ["none", "causal", "window", "padding", "bool", "additive"]
VARIANTS = list(itertools.product([False, True], [None, 2.0], [False, True], [False, True]))


def _case(mask_kind, gqa, B=2, Hq=4, Lq=9, Lk=13, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hk = 2 if gqa else Hq
    q = torch.randn(B, Hq, Lq, D, generator=g) * 1.5
    k = torch.randn(B, Hk, Lk, D, generator=g) * 1.5
    v = torch.randn(B, Hk, Lk, D, generator=g)
    kw, ours = {}, {}
    if mask_kind == "causal":
        kw["causal"] = ours["is_causal"] = True
    elif mask_kind == "window":
        kw["window"] = ours["window"] = (3, 1)
    elif mask_kind == "padding":
        kw["key_lengths"] = ours["key_padding_lengths"] = [Lk, 0]  # row 1 sees no key
        kw["causal"] = ours["is_causal"] = True
    elif mask_kind == "bool":
        m = torch.rand(Lq, Lk, generator=g) < 0.7
        m[0] = False
        kw["mask"] = ours["attn_mask"] = m
    elif mask_kind == "additive":
        m = torch.randn(B, 1, Lq, Lk, generator=g)
        m[0, 0, 1] = float("-inf")
        kw["mask"] = ours["attn_mask"] = m
    return q, k, v, kw, ours


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("gqa,softcap,alibi,sink", VARIANTS)
def test_torch_variants_vs_math(dtype, mask_kind, gqa, softcap, alibi, sink):
    q, k, v, kw, ours = _case(mask_kind, gqa, seed=len(mask_kind))
    Hq = q.shape[1]
    slopes = [2.0 ** (-(h + 1)) for h in range(Hq)] if alibi else None
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if sink else None
    var = dict(gqa=gqa, softcap=softcap, slopes=slopes)
    # float64 reference and the math path in dtype (its own error)
    ins64 = [t.double().requires_grad_() for t in (q, k, v)]
    s64 = sinks.double().requires_grad_() if sink else None
    ref = math_sdpa(*ins64, sinks=s64, **var, **kw)
    go = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
    wrt64 = ins64 + ([s64] if sink else [])
    g64 = torch.autograd.grad(ref, wrt64, go.double())
    # the math path in dtype (bf16 math: fp32 upcast is not what "in dtype" means)
    insd = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    sd = sinks.detach().to(dtype).clone().requires_grad_() if sink else None
    refd = math_sdpa(*insd, sinks=sd, **var,
                     **{a: (b.to(dtype) if isinstance(b, torch.Tensor) and b.is_floating_point()
                            else b) for a, b in kw.items()})
    gd = torch.autograd.grad(refd, insd + ([sd] if sink else []), go.to(dtype))
    # ours (same dtype inputs)
    inso = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    so = sinks.clone().requires_grad_() if sink else None
    out = at.scaled_dot_product_attention(*inso, enable_gqa=gqa, softcap=softcap,
                                          alibi_slopes=slopes, sinks=so, **ours)
    assert out.dtype == dtype and out.shape == ref.shape
    assert attn.last_path()[0] == "fused", attn.last_path()  # the fused kernels take every variant
    go_ours = go.to(dtype)
    out.backward(go_ours)
    assert attn.last_path()[0] == "fused", attn.last_path()
    got = [t.grad for t in inso] + ([so.grad] if sink else [])
    slack = 1e-5 if dtype == torch.float32 else 1e-3
    names = ["out", "dq", "dk", "dv", "dsinks"]
    # the reference's output/grad for the ref in double, compared with both
    # bf16: the reference's gradients are of its bf16 forward; take the
    # floor slack as the rule says.
    for name, x, xd, x64 in zip(names, [out] + got, [refd] + list(gd), [ref] + list(g64)):
        e, ed = rel(x, x64), rel(xd, x64)
        assert e <= 2 * ed + slack, (name, e, ed)


def test_sinks_grad_and_no_alibi_grad():
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    kv = torch.randn(1, 1, 5, 4, requires_grad=True)
    sinks = torch.zeros(2, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], requires_grad=True)
    out = at.scaled_dot_product_attention(q, kv, kv, enable_gqa=True, sinks=sinks,
                                          alibi_slopes=slopes)
    out.sum().backward()
    assert sinks.grad is not None and sinks.grad.shape == (2,)
    assert slopes.grad is None


def test_empty_row_with_sink_is_zero():
    q = torch.randn(1, 2, 3, 8)
    k = torch.randn(1, 2, 4, 8)
    out = at.scaled_dot_product_attention(q, k, k, key_padding_lengths=[0],
                                          sinks=torch.tensor([1.0, -2.0]))
    assert torch.equal(out, torch.zeros_like(out))


def test_three_dim_heads_and_mqa():
    """A 3-D (H, L, E) query: dim -3 is the heads (MQA: one K/V head)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(4, 5, 8, generator=g), torch.randn(1, 6, 8, generator=g), \
        torch.randn(1, 6, 8, generator=g)
    sinks = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, softcap=5.0)
    ref = math_sdpa(q[None].double(), k[None].double(), v[None].double(), gqa=True,
                    softcap=5.0, sinks=sinks.double())[0]
    assert rel(out, ref) < 1e-5


def test_numpy_api_matches_and_returns_dsinks():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    sinks = np.array([0.5, -1, 2, 0], np.float32)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                            softcap=3.0, alibi_slopes=slopes, sinks=sinks)
    qt, kt, vt = (torch.from_numpy(a).double().requires_grad_() for a in (q, k, v))
    st = torch.from_numpy(sinks).double().requires_grad_()
    ref = math_sdpa(qt, kt, vt, causal=True, gqa=True, softcap=3.0, slopes=slopes, sinks=st)
    assert rel(torch.from_numpy(out), ref) < 1e-5
    go = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv, ds = attn.scaled_dot_product_attention_grad(
        go, q, k, v, is_causal=True, enable_gqa=True, softcap=3.0, alibi_slopes=slopes,
        sinks=sinks)
    want = torch.autograd.grad(ref, (qt, kt, vt, st), torch.from_numpy(go).double())
    for got, w in zip((dq, dk, dv, ds), want):
        assert got.shape == tuple(w.shape)
        assert rel(torch.from_numpy(got), w) < 1e-4


def test_varlen_variants_vs_math():
    g = torch.Generator().manual_seed(11)
    H, Hk, D = 4, 2, 8
    lq, lk = [3, 0, 6], [5, 2, 6]
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    q = torch.randn(cq[-1], H, D, generator=g, requires_grad=True)
    k = torch.randn(ck[-1], Hk, D, generator=g, requires_grad=True)
    v = torch.randn(ck[-1], Hk, D, generator=g, requires_grad=True)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    out = at.scaled_dot_product_attention_varlen(q, k, v, cq, ck, is_causal=True,
                                                 enable_gqa=True, softcap=2.0,
                                                 alibi_slopes=slopes, sinks=sinks)
    go = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q, k, v, sinks), go)
    q64, k64, v64, s64 = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    parts = []
    for s in range(3):
        if lq[s] == 0:
            continue
        qs = q64[cq[s]:cq[s + 1]].transpose(0, 1)[None]
        ks = k64[ck[s]:ck[s + 1]].transpose(0, 1)[None]
        vs = v64[ck[s]:ck[s + 1]].transpose(0, 1)[None]
        parts.append(math_sdpa(qs, ks, vs, causal=True, gqa=True, softcap=2.0, slopes=slopes,
                               sinks=s64)[0].transpose(0, 1))
    ref = torch.cat(parts)
    want = torch.autograd.grad(ref, (q64, k64, v64, s64), go.double())
    assert rel(out, ref) < 1e-5
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-4


@pytest.mark.parametrize("kw,msg", [
    (dict(softcap=0.0), "softcap"), (dict(softcap=-1.0), "softcap"),
    (dict(softcap=float("nan")), "softcap"), (dict(alibi_slopes=[1.0, float("inf"), 1, 1]),
                                              "alibi_slopes"),
    (dict(sinks=[0.0, float("nan"), 0, 0]), "sinks"), (dict(alibi_slopes=[1.0, 2.0]),
                                                       "alibi_slopes"),
    (dict(sinks=[1.0]), "sinks")])
def test_bad_variant_arguments(kw, msg):
    q = np.zeros((1, 4, 2, 8), np.float32)
    k = np.zeros((1, 2, 2, 8), np.float32)
    with pytest.raises((ValueError, attn.AttnError), match=msg):
        attn.scaled_dot_product_attention(q, k, k, enable_gqa=True, **kw)


def test_gqa_needs_enable_and_a_multiple():
    q = np.zeros((1, 3, 2, 8), np.float32)
    k = np.zeros((1, 2, 2, 8), np.float32)
    with pytest.raises(ValueError, match="enable_gqa"):
        attn.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="multiple"):
        attn.scaled_dot_product_attention(q, k, k, enable_gqa=True)

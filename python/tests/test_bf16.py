"""bfloat16 attention in Python: attn.scaled_dot_product_attention(_grad)
with dtype="bf16" (uint16 bit patterns) and attn.torch with torch.bfloat16.

Accuracy by FlashAttention's rule: the inputs are bf16 values; the oracle is
float64 autograd of those same values; attn's error (max |attn - fp64|) on
the output and on every gradient must be at most 2x the error of PyTorch
1.13's own bf16 math path (torch.bfloat16 q @ kᵀ, scale, mask, softmax, @ v
and its autograd, all in bf16 on the CPU) plus 1e-3. attn's numpy gradients
are float32, attn.torch's are those rounded to bf16: both are held to the
rule. Masks: none, causal (bottom-right), key padding, bool, additive, and
causal with padding; shapes from decode (Lq = 1, 3) to Lk = 300, D up to 80.
"""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch is the bf16 peer here")

import attn
import attn.torch as at

# (B, H, Lq, Lk, D, Dv)
SHAPES = [(1, 2, 1, 37, 16, 16), (2, 2, 3, 50, 32, 32), (2, 3, 64, 64, 32, 32),
          (1, 2, 100, 130, 64, 48), (1, 1, 17, 300, 80, 80), (2, 2, 3, 97, 17, 33),
          (1, 2, 70, 101, 33, 17)]  # odd head sizes: the pair tails
MASKS = ["none", "causal", "padding", "bool", "additive", "causal+padding"]
WORST = {}  # (path, quantity) -> worst attn error / allowed error


def bits(t):
    """uint16 bit patterns of a bf16 torch tensor (independent of attn's
    conversion: torch's own rounding made the values)."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def case_inputs(shape, mask, seed):
    """bf16 q, k, v, grad_out (torch) and the mask in three forms: attn's
    keyword arguments, a bool keep (B, H, Lq, Lk) and an additive bf16-exact
    float tensor for the torch oracles."""
    B, H, Lq, Lk, D, Dv = shape
    g = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(torch.bfloat16)
    q, k, v = rnd(B, H, Lq, D), rnd(B, H, Lk, D), rnd(B, H, Lk, Dv)
    dout = rnd(B, H, Lq, Dv)
    keep = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
    add = None
    kw = {}
    i = torch.arange(Lq).view(-1, 1)
    j = torch.arange(Lk).view(1, -1)
    if "causal" in mask:
        kw["is_causal"] = True
        keep &= j <= i + (Lk - Lq)
    if "padding" in mask:
        lengths = [max(1, Lk - 7 * b - 3) for b in range(B)]
        kw["key_padding_lengths"] = np.array(lengths)
        for b, n in enumerate(lengths):
            keep[b, :, :, n:] = False
    if mask == "bool":
        m = torch.rand(1, H, Lq, Lk, generator=g) < 0.7
        m[..., 0] = True  # every row sees a key (PyTorch would give NaN)
        kw["attn_mask"] = m
        keep &= m
    if mask == "additive":
        add = (2 * torch.randn(Lq, Lk, generator=g)).to(torch.bfloat16).float()
        kw["attn_mask"] = add
    return q, k, v, dout, keep, add, kw


def math_path(q, k, v, keep, add, scale=None):
    """torch's math path in q's dtype (bf16: PyTorch 1.13's bf16 math)."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5 if scale is None else scale)
    if add is not None:
        s = s + add.to(s.dtype)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def run_math(q, k, v, dout, keep, add, dtype, scale=None):
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = math_path(*leaves, keep, add, scale)
    out.backward(dout.to(dtype))
    return [out.detach().double()] + [x.grad.double() for x in leaves]


def maxerr(a, ref):
    return float((torch.as_tensor(np.asarray(a, np.float64)) - ref).abs().max())


def check_rule(path, label, got):
    """got: attn's [out, dq, dk, dv] (anything float64-convertible)."""
    ref, ours_torch = got["ref"], got["torch"]
    for name, a, r, t in zip(("out", "dq", "dk", "dv"), got["attn"], ref, ours_torch):
        e_attn, e_torch = maxerr(a, r), maxerr(t.numpy(), r)
        allowed = 2 * e_torch + 1e-3
        key = (path, name)
        WORST[key] = max(WORST.get(key, 0.0), e_attn / allowed)
        assert e_attn <= allowed, (
            "%s %s %s: attn error %.3g > 2 x PyTorch bf16 error %.3g + 1e-3"
            % (path, label, name, e_attn, e_torch))


def oracles(q, k, v, dout, keep, add, scale=None):
    return {"ref": run_math(q, k, v, dout, keep, add, torch.float64, scale),
            "torch": run_math(q, k, v, dout, keep, add, torch.bfloat16, scale)}


@pytest.mark.parametrize("scale", [0.7, -0.25, 0.0])
@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_numpy_bf16_explicit_scale(scale, mask):
    """The fused kernels fold a positive scale into exp when there is no
    additive mask (max of the raw scores); a negative or zero scale, or an
    additive mask, takes the scaled-scores route. Both against float64."""
    shape = (1, 2, 100, 130, 64, 48)
    q, k, v, dout, keep, add, kw = case_inputs(shape, mask, 3)
    kw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    qb, kb, vb, gb = (bits(x) for x in (q, k, v, dout))
    out = attn.scaled_dot_product_attention(qb, kb, vb, scale=scale, impl="fused", dtype="bf16",
                                            **kw)
    grads = attn.scaled_dot_product_attention_grad(gb, qb, kb, vb, scale=scale, impl="fused",
                                                   dtype="bf16", **kw)
    got = oracles(q, k, v, dout, keep, add, scale)
    got["attn"] = [attn.float32_from_bf16(out)] + list(grads)
    check_rule("numpy fused scale", "%s %s scale %g" % (shape, mask, scale), got)


@pytest.mark.parametrize("impl", ["reference", "fused"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_numpy_bf16_vs_float64(shape, mask, impl):
    q, k, v, dout, keep, add, kw = case_inputs(shape, mask, 1)
    kw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    qb, kb, vb, gb = (bits(x) for x in (q, k, v, dout))
    out = attn.scaled_dot_product_attention(qb, kb, vb, impl=impl, dtype="bf16", **kw)
    assert out.dtype == np.uint16 and out.shape == gb.shape
    assert attn.last_path()[0] == impl
    grads = attn.scaled_dot_product_attention_grad(gb, qb, kb, vb, impl=impl,
                                                   dtype="bf16", **kw)
    assert all(g.dtype == np.float32 for g in grads)
    got = oracles(q, k, v, dout, keep, add)
    got["attn"] = [attn.float32_from_bf16(out)] + list(grads)
    check_rule("numpy " + impl, "%s %s" % (shape, mask), got)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_torch_bf16_autograd_vs_float64(shape, mask):
    q, k, v, dout, keep, add, kw = case_inputs(shape, mask, 2)
    if "attn_mask" in kw and kw["attn_mask"].is_floating_point():
        kw["attn_mask"] = kw["attn_mask"].to(torch.bfloat16)  # exact: bf16 values
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = at.scaled_dot_product_attention(*leaves, **kw)
    assert out.dtype == torch.bfloat16
    out.backward(dout)
    assert all(x.grad.dtype == torch.bfloat16 for x in leaves)
    got = oracles(q, k, v, dout, keep, add)
    got["attn"] = [out.detach().double()] + [x.grad.double() for x in leaves]
    check_rule("attn.torch", "%s %s" % (shape, mask), got)


def test_torch_bf16_grads_are_the_fp32_grads_rounded():
    """attn.torch's bf16 gradients: the numpy API's float32 gradients (the
    library's) rounded by torch's own float32 -> bf16 conversion."""
    q, k, v, dout, _, _, _ = case_inputs((2, 2, 40, 56, 32, 24), "none", 3)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    at.scaled_dot_product_attention(*leaves, is_causal=True).backward(dout)
    g32 = attn.scaled_dot_product_attention_grad(
        bits(dout), bits(q), bits(k), bits(v), is_causal=True, dtype="bf16")
    for x, g in zip(leaves, g32):
        assert torch.equal(x.grad, torch.from_numpy(g).to(torch.bfloat16))


def test_torch_bf16_strided_inputs_read_in_place():
    q, k, v, _, _, _, _ = case_inputs((1, 2, 30, 30, 16, 16), "none", 4)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, L, D), strided
    out = at.scaled_dot_product_attention(qt, k, v)
    assert at._last_copied() == ()
    ref = at.scaled_dot_product_attention(q.contiguous(), k, v)
    assert torch.equal(out, ref)


def test_bf16_out_is_fp32_out_rounded_once():
    """out_dtype='float32' returns the fp32 output tile; the bf16 output is
    that tile rounded once (torch's rounding as the oracle)."""
    q, k, v, _, _, _, _ = case_inputs((2, 2, 70, 90, 32, 32), "none", 5)
    args = [bits(x) for x in (q, k, v)]
    o32 = attn.scaled_dot_product_attention(*args, dtype="bf16", out_dtype="float32")
    o16 = attn.scaled_dot_product_attention(*args, dtype="bf16")
    assert o32.dtype == np.float32
    assert np.array_equal(o16, bits(torch.from_numpy(o32).to(torch.bfloat16)))


def test_conversions_match_torch():
    x = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, -3.14159, 1e-40,
                  3.4e38, -3.4e38, np.inf, -np.inf, 65504.0, 1.0 + 2**-8,
                  1.0 + 3 * 2**-8], np.float32)
    u = attn.bf16_from_float32(x)
    assert u.dtype == np.uint16 and u.shape == x.shape
    assert np.array_equal(u, bits(torch.from_numpy(x).to(torch.bfloat16)))
    back = attn.float32_from_bf16(u)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    nan = attn.bf16_from_float32(np.array([np.nan], np.float32))
    assert np.isnan(attn.float32_from_bf16(nan))[0]


def test_zero_size_bf16():
    q = np.zeros((2, 3, 4, 8), np.uint16)
    k = np.zeros((2, 3, 0, 8), np.uint16)
    out = attn.scaled_dot_product_attention(q, k, k, dtype="bf16")
    assert out.dtype == np.uint16 and out.shape == (2, 3, 4, 8) and not out.any()


def test_bad_dtypes_refused():
    f = np.zeros((1, 1, 4, 8), np.float32)
    u = np.zeros((1, 1, 4, 8), np.uint16)
    with pytest.raises(ValueError, match="uint16 array.*bf16_from_float32"):
        attn.scaled_dot_product_attention(f, f, f, dtype="bf16")
    with pytest.raises(ValueError, match="out_dtype='bf16' needs dtype='bf16'"):
        attn.scaled_dot_product_attention(f, f, f, out_dtype="bf16")
    with pytest.raises(ValueError, match="dtype must be None, 'float32' or 'bf16'"):
        attn.scaled_dot_product_attention(u, u, u, dtype="fp16")
    with pytest.raises(ValueError, match="grad_out.*uint16"):
        attn.scaled_dot_product_attention_grad(f, u, u, u, dtype="bf16")
    b = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    with pytest.raises(at.UnsupportedError, match="one dtype"):
        at.scaled_dot_product_attention(b, b.float(), b)
    with pytest.raises(at.UnsupportedError, match="float32 and bfloat16"):
        at.scaled_dot_product_attention(b.half(), b.half(), b.half())
    with pytest.raises(at.UnsupportedError, match="bfloat16"):
        at.scaled_dot_product_attention_varlen(b[0, 0].view(4, 1, 8), b[0, 0].view(4, 1, 8),
                                               b[0, 0].view(4, 1, 8), [0, 4])


DIGEST = r"""
import hashlib, numpy as np, attn
rng = np.random.default_rng(0)
h = hashlib.sha256()
for B, H, Lq, Lk, D, causal in [(1, 2, 100, 130, 64, False), (2, 2, 3, 97, 17, True),
                                (1, 1, 300, 300, 80, True), (2, 3, 64, 64, 33, False)]:
    q, k, v, g = (attn.bf16_from_float32(rng.standard_normal((B, H, n, D)).astype(np.float32))
                  for n in (Lq, Lk, Lk, Lq))
    o = attn.scaled_dot_product_attention(q, k, v, is_causal=causal, impl="fused", dtype="bf16")
    for x in [o] + list(attn.scaled_dot_product_attention_grad(g, q, k, v, is_causal=causal,
                                                                impl="fused", dtype="bf16")):
        h.update(np.ascontiguousarray(x).tobytes())
print(attn.last_path()[1].split(" kernels")[0], h.hexdigest())
"""


def test_bf16_avx2_kernels_are_the_portable_bits():
    """On x86-64 CPUs with AVX2 and no AVX512_BF16 the bf16 kernels are the
    portable C compiled 8 wide without fp contraction: forced by
    ATTN_FUSED_ISA, forward and backward give the portable path's bits."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    with open("/proc/cpuinfo") as f:
        if " avx2" not in f.read():
            pytest.skip("no AVX2 here")
    out = {}
    for isa in ("portable", "avx2"):
        r = subprocess.run([sys.executable, "-c", DIGEST], env=dict(os.environ, ATTN_FUSED_ISA=isa),
                           capture_output=True, text=True, check=True)
        name, digest = r.stdout.split()[-2:]
        out[isa] = digest
        assert name.endswith(isa), r.stdout
    assert out["portable"] == out["avx2"]


@pytest.mark.parametrize("Lq", [1, 50])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_padding_garbage_stays_out(Lq, causal):
    """Keys past key_padding_lengths are padding: NaN and inf there must not
    reach the output or the gradients (0 x NaN in P.V or dS.K would); the
    results are those of zero padding bit for bit, as in fp32."""
    rng = np.random.default_rng(4)
    B, H, L, D = 2, 2, 50, 32
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    lens = np.array([37, 20])
    runs = []
    for fill in (0.0, np.nan, np.inf):
        kf, vf = k.copy(), v.copy()
        for b, n in enumerate(lens):
            kf[b, :, n:] = fill
            vf[b, :, n:] = -fill
        qb, kb, vb, gb = (attn.bf16_from_float32(x) for x in (q, kf, vf, g))
        kw = dict(is_causal=causal, impl="fused", dtype="bf16", key_padding_lengths=lens)
        out = attn.scaled_dot_product_attention(qb, kb, vb, **kw)
        grads = attn.scaled_dot_product_attention_grad(gb, qb, kb, vb, **kw)
        dk, dv = grads[1].copy(), grads[2].copy()
        for b, n in enumerate(lens):  # padding keys' own gradients: 0 whatever they hold
            assert not dk[b, :, n:].any() and not dv[b, :, n:].any()
        runs.append([out, grads[0], dk, dv])
    for r in runs[1:]:
        for a, z in zip(r, runs[0]):
            assert np.isfinite(attn.float32_from_bf16(a) if a.dtype == np.uint16 else a).all()
            assert np.array_equal(a, z)


def _attention64(q, k, v, g):
    """float64 softmax(q kᵀ / sqrt(D)) v and its gradients (numpy, no
    mask): dV = Pᵀ dO, dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)), dQ = dS K s,
    dK = dSᵀ Q s."""
    s = 1.0 / np.sqrt(q.shape[-1])
    S = q @ np.swapaxes(k, -1, -2) * s
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    O = P @ v
    dP = g @ np.swapaxes(v, -1, -2)
    dS = P * (dP - (g * O).sum(-1, keepdims=True))
    return O, dS @ k * s, np.swapaxes(dS, -1, -2) @ q * s, np.swapaxes(P, -1, -2) @ g


def test_uint16_bits_need_bf16():
    """uint16 arrays (bfloat16 bits: numpy has no bf16) are refused unless
    bf16 is asked for: as q, k, v without dtype='bf16', as grad_out with
    out_dtype='float32' (it would be read as integers: 48,896 for -0.5, a
    gradient 1e4 off), in the varlen and multi-head calls (fp32 only). The
    calls that do ask for bf16 match float64 on the same values."""
    rng = np.random.default_rng(3)
    q, k, v, g = (attn.bf16_from_float32(rng.standard_normal((2, 2, n, 16)).astype(np.float32))
                  for n in (5, 9, 9, 5))
    q64, k64, v64, g64 = (attn.float32_from_bf16(x).astype(np.float64) for x in (q, k, v, g))
    O, dQ, dK, dV = _attention64(q64, k64, v64, g64)
    with pytest.raises(ValueError, match=r"query is a uint16 array.*dtype='bf16'"):
        attn.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match=r"query is a uint16 array.*dtype='bf16'"):
        attn.scaled_dot_product_attention(q, k, v, out_dtype="float32")
    with pytest.raises(ValueError, match=r"grad_out .*uint16 array.*out_dtype='bf16'"):
        attn.scaled_dot_product_attention_grad(g, q, k, v, dtype="bf16", out_dtype="float32")
    with pytest.raises(ValueError, match=r"key is a uint16 array"):
        attn.scaled_dot_product_attention_grad(attn.float32_from_bf16(g), attn.float32_from_bf16(q),
                                               k, attn.float32_from_bf16(v))
    with pytest.raises(ValueError, match=r"query is a uint16 array"):
        attn.scaled_dot_product_attention_varlen(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2),
                                                 v[0].transpose(1, 0, 2), [0, 5], [0, 9])
    m = attn.MultiheadAttention(16, 2, seed=0)
    with pytest.raises(ValueError, match=r"query is a uint16 array"):
        m(q[0], q[0], q[0])
    # asked for: float64 on the same bf16 values. The reference path with an
    # fp32 out is fp32 on the exact values (1e-5 of the largest); the fused
    # kernels round P and dS to bf16, and a bf16 out (grads16: the backward's
    # D = dO·O from it) is rounded too (2^-8 relative each): 2^-6.
    for impl, tol in (("reference", 1e-5), ("fused", 2.0**-6)):
        o = attn.scaled_dot_product_attention(q, k, v, dtype="bf16", out_dtype="float32",
                                              impl=impl)
        grads16 = attn.scaled_dot_product_attention_grad(g, q, k, v, dtype="bf16", impl=impl)
        grads32 = attn.scaled_dot_product_attention_grad(attn.float32_from_bf16(g), q, k, v,
                                                         dtype="bf16", out_dtype="float32",
                                                         impl=impl)
        assert np.abs(o - O).max() <= tol * np.abs(O).max(), impl
        for got, t in ((grads16, 2.0**-6), (grads32, tol)):
            for x, ref in zip(got, (dQ, dK, dV)):
                assert x.dtype == np.float32
                assert np.abs(x - ref).max() <= t * np.abs(ref).max(), impl


AMX_RUN = r"""
import sys
import numpy as np
import attn
d = dict(np.load(sys.argv[1]))
if not attn.enable_amx():
    print("no-amx")
    sys.exit(0)
out = {}
for key in sorted({k.split(":")[0] for k in d}):
    q, k, v, g = (d[key + ":" + n] for n in "qkvg")
    causal = key.endswith("c")
    out[key + ":o"] = attn.scaled_dot_product_attention(q, k, v, is_causal=causal, impl="fused",
                                                        dtype="bf16")
    path = attn.last_path()[1]
    for n, x in zip("QKV", attn.scaled_dot_product_attention_grad(g, q, k, v, is_causal=causal,
                                                                   impl="fused", dtype="bf16")):
        out[key + ":" + n] = x
np.savez(sys.argv[2], **out)
print(path)
"""


def test_bf16_amx_row_vs_float64(tmp_path):
    """Where the CPU has AMX, attn.enable_amx() (in a child process: the
    grant is process-wide) switches the bf16 kernels to tiles, and their
    forward and backward keep FlashAttention's rule against float64 on
    shapes of whole and partial 16-row blocks and 32-element chunks."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    shapes = {"a": (1, 2, 100, 130, 64, 64), "bc": (2, 2, 70, 200, 128, 128),
              "cc": (1, 1, 300, 300, 80, 80), "d": (2, 1, 50, 97, 32, 32)}
    ins, cases = {}, {}
    for key, shape in shapes.items():
        q, k, v, dout, keep, add, kw = case_inputs(shape, "causal" if key.endswith("c") else "none", 5)
        cases[key] = (q, k, v, dout, keep, add)
        for n, x in zip("qkvg", (q, k, v, dout)):
            ins[key + ":" + n] = bits(x)
    np.savez(tmp_path / "in.npz", **ins)
    r = subprocess.run([sys.executable, "-c", AMX_RUN, str(tmp_path / "in.npz"),
                        str(tmp_path / "out.npz")], capture_output=True, text=True, check=True)
    if r.stdout.strip() == "no-amx":
        pytest.skip("no AMX on this CPU")
    assert "amx kernels" in r.stdout, r.stdout
    res = np.load(tmp_path / "out.npz")
    for key, (q, k, v, dout, keep, add) in cases.items():
        got = oracles(q, k, v, dout, keep, add)
        got["attn"] = [attn.float32_from_bf16(res[key + ":o"])] + [res[key + ":" + n] for n in "QKV"]
        check_rule("numpy fused amx", "%s %s" % (key, shapes[key]), got)

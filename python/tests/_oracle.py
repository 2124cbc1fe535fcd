"""Oracles (PyTorch 1.13's math path, float64) and the one error metric."""
import collections
import math

import numpy as np
import torch

TOL = 1e-5

# label -> [max relative error, number of comparisons]
_RECORD = collections.OrderedDict()


def record(label, err):
    r = _RECORD.setdefault(label, [0.0, 0])
    r[0] = max(r[0], err)
    r[1] += 1


def summary_rows():
    return [(k, v[0], v[1]) for k, v in sorted(_RECORD.items())]


def rel_err(ours, ref):
    """max |ours - ref| / max |ref| over the entries where ref is finite."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    denom = np.abs(ref[fin]).max()
    diff = np.abs(ours[fin] - ref[fin]).max()
    if denom == 0.0:
        return float(diff)
    return float(diff / denom)


def check_close(label, ours, ref, tol=TOL, nan_means_zero=True):
    """Compare ours with the oracle, record the error under label.

    Where the oracle is NaN (PyTorch's fully masked rows) ours must be
    exactly 0; everywhere ours must be finite."""
    ours = np.asarray(ours)
    ref = np.asarray(ref)
    assert ours.shape == ref.shape, "%s: shape %s != oracle %s" % (
        label, ours.shape, ref.shape)
    assert np.all(np.isfinite(ours)), "%s: non-finite values in ours" % label
    if nan_means_zero:
        bad = ~np.isfinite(ref)
        assert np.all(ours[bad] == 0), (
            "%s: ours is not 0 where every key is masked" % label)
    err = rel_err(ours, ref)
    record(label, err)
    assert err <= tol, "%s: max relative error %.3e > %.0e" % (label, err, tol)
    return err


def rand(rng, *shape, scale=1.0):
    """float32 normal samples (exactly representable in both libraries)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def structural_keep(lead, Lq, Lk, causal=False, key_lengths=None, window=None):
    """bool [*lead, Lq, Lk]: True where causal / key lengths / window let a
    query see a key. Causal is bottom-right aligned: j <= i + Lk - Lq."""
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    ia = i + Lk - Lq
    keep = np.ones(tuple(lead) + (Lq, Lk), dtype=bool)
    if causal:
        keep &= j <= ia
    if key_lengths is not None:
        kl = np.asarray(key_lengths).reshape((-1,) + (1,) * (len(lead) + 1))
        if len(lead) == 0:
            kl = kl.reshape(1, 1)
        keep &= j < kl
    if window is not None:
        left, right = window
        if left is not None:
            keep &= j >= ia - left
        if right is not None:
            keep &= j <= ia + right
    return keep


def torch_sdpa(q, k, v, keep=None, add=None, scale=None, dtype=torch.float64):
    """PyTorch's math path: softmax(q kᵀ * scale + add, masked_fill(~keep,
    -inf)) v. keep/add broadcast to (..., Lq, Lk). Returns (out, weights) as
    numpy; fully masked rows are NaN as in PyTorch."""
    qt = torch.from_numpy(np.asarray(q)).to(dtype)
    kt = torch.from_numpy(np.asarray(k)).to(dtype)
    vt = torch.from_numpy(np.asarray(v)).to(dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = qt @ kt.transpose(-2, -1) * scale
    if add is not None:
        s = s + torch.from_numpy(np.array(
            np.broadcast_to(np.asarray(add, dtype=np.float64), s.shape))).to(dtype)
    if keep is not None:
        kb = torch.from_numpy(np.array(np.broadcast_to(keep, s.shape)))
        s = s.masked_fill(~kb, float("-inf"))
    w = torch.softmax(s, dim=-1)
    out = w @ vt
    return out.numpy(), w.numpy()


# ------------------------------------------------------------ gradients

GRAD_TOL = 1e-4

# label -> list of text lines (dropout statistics etc.)
_STATS = collections.OrderedDict()


def record_stat(label, text):
    _STATS.setdefault(label, []).append(text)


def stat_rows():
    return list(_STATS.items())


def check_grad(group, case, name, ours, ref, tol=GRAD_TOL):
    """Compare a gradient with the autograd oracle (finite everywhere), and
    record it under grad/<group>/<case>/<name> for the summary table."""
    ours = np.asarray(ours)
    ref = np.asarray(ref)
    assert np.all(np.isfinite(ref)), "oracle for %s/%s/%s is not finite" % (
        group, case, name)
    return check_close("grad/%s/%s/%s" % (group, case, name), ours, ref,
                       tol=tol, nan_means_zero=False)


def _t64(x, requires_grad=False):
    t = torch.from_numpy(np.array(x, dtype=np.float64))
    if requires_grad:
        t.requires_grad_(True)
    return t


def safe_attention(Q, K, V, keep=None, add=None, scale=None, drop=None):
    """softmax(Q Kᵀ scale + add, masked_fill(~keep, -inf)) (∘ drop) V in
    torch (differentiable), with the rows that see no key giving weights 0
    (and zero gradient) instead of PyTorch's NaN. drop: multipliers
    mask/(1-p) broadcastable to the weights, or None."""
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    s = Q @ K.transpose(-2, -1) * scale
    if add is not None:
        s = s + torch.from_numpy(np.array(
            np.broadcast_to(np.asarray(add, dtype=np.float64), s.shape)))
    if keep is not None:
        kb = torch.from_numpy(np.array(np.broadcast_to(keep, s.shape)))
        s = s.masked_fill(~kb, float("-inf"))
    valid = torch.isfinite(s.detach()).any(dim=-1, keepdim=True)
    s = torch.where(valid, s, torch.zeros_like(s))
    w = torch.softmax(s, dim=-1) * valid.to(s.dtype)
    if drop is not None:
        w = w * torch.from_numpy(np.array(
            np.broadcast_to(np.asarray(drop, dtype=np.float64), w.shape)))
    return w @ V


def torch_sdpa_grad(q, k, v, grad_out, keep=None, add=None, scale=None,
                    drop=None):
    """float64 autograd through safe_attention. Returns numpy
    (out, dq, dk, dv)."""
    Q, K, V = (_t64(a, True) for a in (q, k, v))
    out = safe_attention(Q, K, V, keep=keep, add=add, scale=scale, drop=drop)
    out.backward(_t64(grad_out))
    return (out.detach().numpy(), Q.grad.numpy(), K.grad.numpy(),
            V.grad.numpy())


def torch_mha_functional(params, E, H, q, k, v, keep=None, add=None,
                         drop=None):
    """Batch-first multi-head attention in torch from a dict of float64
    parameter tensors under attn's names (in_proj_weight or q/k/v_proj_weight,
    in_proj_bias, out_proj_weight, out_proj_bias; missing biases = none).
    q [B, Lq, E], k [B, Lk, kdim], v [B, Lk, vdim] tensors; keep/add/drop
    broadcast to [B, H, Lq, Lk]. Returns out [B, Lq, E]."""
    if params.get("in_proj_weight") is not None:
        wq, wk, wv = params["in_proj_weight"].split(E, dim=0)
    else:
        wq, wk, wv = (params["q_proj_weight"], params["k_proj_weight"],
                      params["v_proj_weight"])
    b = params.get("in_proj_bias")
    bq, bk, bv = b.split(E) if b is not None else (None, None, None)

    def proj(x, w, bias):
        y = x @ w.t()
        return y + bias if bias is not None else y

    B, Lq, Lk, Dh = q.shape[0], q.shape[1], k.shape[1], E // H
    Qp = proj(q, wq, bq).reshape(B, Lq, H, Dh).transpose(1, 2)
    Kp = proj(k, wk, bk).reshape(B, Lk, H, Dh).transpose(1, 2)
    Vp = proj(v, wv, bv).reshape(B, Lk, H, Dh).transpose(1, 2)
    A = safe_attention(Qp, Kp, Vp, keep=keep, add=add, drop=drop)
    A = A.transpose(1, 2).reshape(B, Lq, E)
    return proj(A, params["out_proj_weight"], params.get("out_proj_bias"))


def dropout_multipliers(lead, Lq, Lk, p, seed, offset=0):
    """The library's dropout multipliers (0 or 1/(1-p)) for elements
    (*lead, i, j) under (seed, offset), read through the forward: with
    q = k = 0 every weight is 1/Lk and with v = I the output is
    weight * keep / (1 - p), so it shows each element's mask."""
    import attn
    z = np.zeros(tuple(lead) + (Lq, 1), np.float32)
    zk = np.zeros(tuple(lead) + (Lk, 1), np.float32)
    eye = np.broadcast_to(np.eye(Lk, dtype=np.float32), tuple(lead) + (Lk, Lk))
    out = attn.scaled_dot_product_attention(z, zk, eye, dropout_p=p, seed=seed,
                                            offset=offset)
    keep = out != 0
    # every kept entry must be exactly (1/Lk)/(1-p) up to rounding
    if keep.any():
        np.testing.assert_allclose(out[keep], 1.0 / Lk / (1.0 - p), rtol=1e-6)
    return keep.astype(np.float64) / (1.0 - p)


# ------------------------------------------------------------ Philox

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_U32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr, key):
    """Philox-4x32-10 (Salmon et al., Random123) in numpy: ctr uint32
    [..., 4], key (k0, k1) Python ints. Returns uint32 [..., 4]."""
    c = [np.asarray(ctr[..., r], dtype=np.uint64) for r in range(4)]
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for _ in range(10):
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & _U32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & _U32]
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return np.stack(c, axis=-1).astype(np.uint32)


def _splitmix64(z):
    m = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def splitmix_key(seed, offset):
    """attn.h's dropout key: splitmix64(splitmix64(seed) ^ offset)."""
    return _splitmix64(_splitmix64(seed) ^ offset)


def philox_keep(B, H, Lq, Lk, p, seed, offset):
    """bool [B, H, Lq, Lk] keep mask as attn.h specifies it: Philox-4x32-10
    keyed by (seed, offset), counter (j / 4, i, h, b), word j % 4; dropped
    iff the word < p * 2^32 (p rounded to float32, as the C field is)."""
    key = splitmix_key(seed & ((1 << 64) - 1), offset & ((1 << 64) - 1))
    nb = (Lk + 3) // 4
    b, h, i, c = np.meshgrid(np.arange(B), np.arange(H), np.arange(Lq),
                             np.arange(nb), indexing="ij")
    ctr = np.stack([c, i, h, b], axis=-1).astype(np.uint32)
    words = philox4x32_10(ctr, (key & 0xFFFFFFFF, key >> 32))
    words = words.reshape(B, H, Lq, nb * 4)[..., :Lk]
    t = math.ldexp(float(np.float32(p)), 32)
    thr = 0xFFFFFFFF if t >= 4294967295.0 else int(t)
    return words >= np.uint32(thr)

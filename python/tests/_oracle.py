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

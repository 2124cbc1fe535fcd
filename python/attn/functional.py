"""attn.scaled_dot_product_attention: PyTorch 2's functional SDPA over libattn."""
import ctypes
import math
import threading

import numpy as np

from . import _lib
from ._views import (as_float_array, as_index, as_numpy, mask_array,
                     mask_view, out_tensor, tensor_view)

_last = threading.local()


def last_path():
    """(impl_name, reason) of the last scaled_dot_product_attention call in
    this thread: impl_name is "reference" or "fused" (the path that ran),
    reason the library's explanation. (None, None) before any call."""
    return getattr(_last, "path", (None, None))


def _impl_code(impl):
    if impl is None:
        return _lib.ATTN_IMPL_AUTO
    if isinstance(impl, str):
        try:
            return _lib.IMPL_CODES[impl.lower()]
        except KeyError:
            pass
    raise ValueError("impl must be None, 'auto', 'reference' or 'fused', got %r"
                     % (impl,))


def build_params(*, scale=None, is_causal=False, key_lengths=None, window=None,
                 dropout_p=0.0, training=None, seed=0, offset=0, impl=None,
                 num_threads=0):
    """attn_sdpa_params (masks are attached by the caller). key_lengths must
    already be a contiguous int64 array that the caller keeps alive."""
    p = _lib.attn_sdpa_params()
    if scale is None:
        p.scale = 0.0
    else:
        p.scale = float(scale)
    p.causal = 1 if is_causal else 0
    if key_lengths is not None:
        p.key_lengths = key_lengths.ctypes.data_as(_lib.c_int64_p)
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise ValueError("window must be a pair (left, right), got %r"
                             % (window,)) from None
        p.use_window = 1
        p.window_left = (_lib.ATTN_UNBOUNDED if left is None
                         else as_index(left, "window left"))
        p.window_right = (_lib.ATTN_UNBOUNDED if right is None
                          else as_index(right, "window right"))
    p.dropout_p = float(dropout_p)
    if training is None:
        training = dropout_p > 0
    p.training = 1 if training else 0
    p.seed = as_index(seed, "seed") & 0xFFFFFFFFFFFFFFFF
    p.offset = as_index(offset, "offset") & 0xFFFFFFFFFFFFFFFF
    p.impl = _impl_code(impl)
    p.num_threads = as_index(num_threads, "num_threads")
    return p


class _Call:
    """The validated inputs of one SDPA call: 4-D views, params and the
    arrays they point into (kept alive as long as this object)."""


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
             key_padding_lengths, window, seed, offset, impl, num_threads):
    c = _Call()
    c.q, c.tq = tensor_view(query, "query")
    c.k, c.tk = tensor_view(key, "key")
    c.v, c.tv = tensor_view(value, "value")
    c.lead = lead = c.q.shape[:-2]
    if c.k.shape[:-2] != lead or c.v.shape[:-2] != lead:
        raise ValueError(
            "query, key and value must have the same leading dims: got shapes "
            "%s, %s, %s" % (c.q.shape, c.k.shape, c.v.shape))
    c.Lq, c.Lk, c.Dv = c.q.shape[-2], c.k.shape[-2], c.v.shape[-1]
    B = int(c.tq.dim[0])

    c.keep = []
    c.zero_scale = False
    if scale is not None:
        scale = float(scale)
        if scale == 0.0 and math.isfinite(scale):
            # the C API reads scale 0 as "default"; an explicit 0 means all
            # scores 0, which (0 * query) @ keyᵀ * 1 reproduces exactly (and
            # its gradient w.r.t. query is 0, which the caller sets).
            c.zero_scale = True
            c.q, c.tq = tensor_view(np.zeros(c.q.shape, np.float32), "query")
            scale = 1.0

    kl = None
    if key_padding_lengths is not None:
        kl = as_numpy(key_padding_lengths)
        if kl.dtype.kind not in "iu" and not (kl.size == 0 and kl.dtype.kind == "f"):
            raise ValueError("key_padding_lengths must be integers, got dtype %s"
                             % kl.dtype)
        kl = np.ascontiguousarray(kl.reshape(-1), dtype=np.int64)
        if kl.shape[0] != B:
            raise ValueError(
                "key_padding_lengths needs one entry per batch element (%d, the "
                "first leading dim of query), got %d" % (B, kl.shape[0]))
    c.key_lengths = kl

    c.p = p = build_params(scale=scale, is_causal=is_causal, key_lengths=kl,
                           window=window, dropout_p=dropout_p, seed=seed,
                           offset=offset, impl=impl, num_threads=num_threads)

    if attn_mask is not None:
        m, is_bool = mask_array(attn_mask, "attn_mask")
        mb, mv = mask_view(m, lead, c.Lq, c.Lk, "attn_mask")
        c.keep.append((mb, mv))
        if is_bool:
            p.bool_mask = ctypes.pointer(mv)
        else:
            p.add_mask = ctypes.pointer(mv)
    return c


def _set_path(info):
    _last.path = (_lib.IMPL_NAMES.get(info.impl, str(info.impl)),
                  info.reason.decode("utf-8", "replace"))


def _forward(c, out_t, weights, lse):
    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_forward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
        ctypes.byref(c.p), ctypes.byref(out_t), _lib.float_ptr(weights),
        _lib.float_ptr(lse), ctypes.byref(info), ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info)


def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None, *,
                                 key_padding_lengths=None, window=None,
                                 need_weights=False, seed=0, offset=0,
                                 impl=None, num_threads=0):
    """softmax(query @ keyᵀ * scale + masks) @ value, like PyTorch 2's
    torch.nn.functional.scaled_dot_product_attention.

    query (..., Lq, E), key (..., Lk, E), value (..., Lk, Ev), with the same
    leading dims (zero or more). Returns out (..., Lq, Ev) float32, or
    (out, weights) with weights (..., Lq, Lk) when need_weights.

    attn_mask: bool (True = takes part) or float (added to the scaled scores),
      broadcastable to (..., Lq, Lk).
    is_causal: query i sees keys j <= i + Lk - Lq (bottom-right aligned; the
      same as PyTorch's top-left alignment when Lq == Lk). May be combined
      with attn_mask.
    scale: None -> 1/sqrt(E).
    key_padding_lengths: ints, one per element of the first leading dim (1
      when there is none): keys j >= length do not take part.
    window: (left, right): query i (absolute position i + Lk - Lq) sees keys
      in [pos - left, pos + right]; None on a side = unbounded.
    dropout_p / seed / offset: dropout on the weights (applied when
      dropout_p > 0, as PyTorch's functional does), dropout_p in [0, 1).
      The mask is a pure function of (seed, offset) and the element's
      (b, h, i, j): the same for any thread count, and the same in
      scaled_dot_product_attention_grad given the same seed and offset.
    impl: None / "auto", "reference" or "fused". num_threads: 0 = global.
    A query row with no visible key gets output 0 and weights 0 (PyTorch: NaN).
    """
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
                 key_padding_lengths, window, seed, offset, impl, num_threads)
    out, tout = out_tensor(c.lead + (c.Lq, c.Dv))
    weights = None
    if need_weights:
        weights = np.empty(c.lead + (c.Lq, c.Lk), dtype=np.float32)

    if out.size == 0 and (weights is None or weights.size == 0):
        _last.path = (None, "empty output: nothing computed")
        return (out, weights) if need_weights else out

    _forward(c, tout, weights, None)
    return (out, weights) if need_weights else out


def scaled_dot_product_attention_grad(grad_out, query, key, value,
                                      attn_mask=None, dropout_p=0.0,
                                      is_causal=False, scale=None, *,
                                      key_padding_lengths=None, window=None,
                                      seed=0, offset=0, impl=None,
                                      num_threads=0):
    """Gradients of scaled_dot_product_attention: (dq, dk, dv), float32
    arrays with the shapes of query, key and value.

    grad_out has the shape of the forward's output (..., Lq, Ev). Every other
    argument means what it means for scaled_dot_product_attention and must
    be the same as in the forward being differentiated; in particular the
    same dropout_p, seed and offset give the same dropout mask, so these are
    the gradients of exactly that forward's output. The forward is run again
    here (attn_sdpa_forward, saving the per-row log-sum-exp), then
    attn_sdpa_backward. A query row that sees no key contributes zero
    gradient (its output is the constant 0).
    """
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
                 key_padding_lengths, window, seed, offset, impl, num_threads)
    out_shape = c.lead + (c.Lq, c.Dv)
    g = as_float_array(grad_out, "grad_out")
    if g.shape != out_shape:
        raise ValueError("grad_out must have the shape of the output %s, got %s"
                         % (out_shape, g.shape))
    g, tg = tensor_view(g, "grad_out")

    dq, tdq = out_tensor(c.q.shape)
    dk, tdk = out_tensor(c.k.shape)
    dv, tdv = out_tensor(c.v.shape)
    if g.size == 0:  # empty output (as the forward): nothing flows back
        for a in (dq, dk, dv):
            a[...] = 0
        _last.path = (None, "empty output: nothing computed")
        return dq, dk, dv

    out, tout = out_tensor(out_shape)
    lse = np.empty(c.lead + (c.Lq,), dtype=np.float32)
    _forward(c, tout, None, lse)

    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_backward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
        ctypes.byref(tout), _lib.float_ptr(lse), ctypes.byref(tg),
        ctypes.byref(c.p), ctypes.byref(tdq), ctypes.byref(tdk),
        ctypes.byref(tdv), ctypes.byref(info), ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info)
    if c.zero_scale:
        dq[...] = 0  # scores do not depend on query at all
    return dq, dk, dv

"""attn.scaled_dot_product_attention: PyTorch 2's functional SDPA over libattn."""
import ctypes
import math
import threading

import numpy as np

from . import _lib
from ._views import as_index, mask_array, mask_view, out_tensor, tensor_view

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
      dropout_p > 0, as PyTorch's functional does).
    impl: None / "auto", "reference" or "fused". num_threads: 0 = global.
    A query row with no visible key gets output 0 and weights 0 (PyTorch: NaN).
    """
    q, tq = tensor_view(query, "query")
    k, tk = tensor_view(key, "key")
    v, tv = tensor_view(value, "value")
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead:
        raise ValueError(
            "query, key and value must have the same leading dims: got shapes "
            "%s, %s, %s" % (q.shape, k.shape, v.shape))
    Lq, Lk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    B = int(tq.dim[0])

    keep = []
    if scale is not None:
        scale = float(scale)
        if scale == 0.0 and math.isfinite(scale):
            # the C API reads scale 0 as "default"; an explicit 0 means all
            # scores 0, which (0 * query) @ keyᵀ * 1 reproduces exactly.
            q, tq = tensor_view(np.zeros(q.shape, np.float32), "query")
            scale = 1.0

    kl = None
    if key_padding_lengths is not None:
        kl = np.asarray(key_padding_lengths)
        if kl.dtype.kind not in "iu" and not (kl.size == 0 and kl.dtype.kind == "f"):
            raise ValueError("key_padding_lengths must be integers, got dtype %s"
                             % kl.dtype)
        kl = np.ascontiguousarray(kl.reshape(-1), dtype=np.int64)
        if kl.shape[0] != B:
            raise ValueError(
                "key_padding_lengths needs one entry per batch element (%d, the "
                "first leading dim of query), got %d" % (B, kl.shape[0]))

    p = build_params(scale=scale, is_causal=is_causal, key_lengths=kl,
                     window=window, dropout_p=dropout_p, seed=seed,
                     offset=offset, impl=impl, num_threads=num_threads)

    if attn_mask is not None:
        m, is_bool = mask_array(attn_mask, "attn_mask")
        mb, mv = mask_view(m, lead, Lq, Lk, "attn_mask")
        keep.append((mb, mv))
        if is_bool:
            p.bool_mask = ctypes.pointer(mv)
        else:
            p.add_mask = ctypes.pointer(mv)

    out, tout = out_tensor(lead + (Lq, Dv))
    weights = None
    if need_weights:
        weights = np.empty(lead + (Lq, Lk), dtype=np.float32)

    if out.size == 0 and (weights is None or weights.size == 0):
        _last.path = (None, "empty output: nothing computed")
        return (out, weights) if need_weights else out

    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_forward(
        ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(p),
        ctypes.byref(tout), _lib.float_ptr(weights), None, ctypes.byref(info),
        ctypes.byref(err))
    _lib.check(st, err)
    _last.path = (_lib.IMPL_NAMES.get(info.impl, str(info.impl)),
                  info.reason.decode("utf-8", "replace"))
    del keep
    return (out, weights) if need_weights else out

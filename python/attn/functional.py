"""attn.scaled_dot_product_attention: PyTorch 2's functional SDPA over libattn."""
import ctypes
import math
import threading

import numpy as np

from . import _lib
from ._views import (as_float_array, as_numpy, as_ranged_int, bf16_array,
                     c_array, int64_arg, mask_array, mask_view, out_tensor,
                     packed_view, tensor_view, uint64_arg)

_last = threading.local()
_FLT_MAX = float(np.finfo(np.float32).max)


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


_DTYPES = {"float32": _lib.ATTN_F32, "fp32": _lib.ATTN_F32,
           "bf16": _lib.ATTN_BF16, "bfloat16": _lib.ATTN_BF16}


def dtype_code(dtype, name="dtype"):
    """ATTN_F32 for None / "float32" / "fp32" / numpy float32, ATTN_BF16 for
    "bf16" / "bfloat16"; anything else raises ValueError."""
    if dtype is None:
        return _lib.ATTN_F32
    if isinstance(dtype, str):
        code = _DTYPES.get(dtype.lower())
        if code is not None:
            return code
    else:
        try:
            if np.dtype(dtype) == np.float32:
                return _lib.ATTN_F32
        except TypeError:
            pass
    raise ValueError("%s must be None, 'float32' or 'bf16', got %r" % (name, dtype))


def bf16_from_float32(x):
    """x rounded to bfloat16 (nearest, ties to even; NaN stays NaN, beyond
    bf16's range inf): a uint16 array of the bit patterns, x's shape. The
    library's attn_bf16_from_f32."""
    a = c_array(as_numpy(x), np.float32)
    u = np.empty(a.shape, np.uint16)
    _lib.lib.attn_bf16_from_f32(a.ctypes.data_as(_lib.c_float_p),
                                u.ctypes.data_as(_lib.c_uint16_p), a.size)
    return u


def float32_from_bf16(u):
    """float32 values (exact) of a uint16 array of bfloat16 bit patterns."""
    b = c_array(bf16_array(u, "float32_from_bf16", 0), np.uint16)
    a = np.empty(b.shape, np.float32)
    _lib.lib.attn_f32_from_bf16(b.ctypes.data_as(_lib.c_uint16_p),
                                a.ctypes.data_as(_lib.c_float_p), b.size)
    return a


def _f32_scalar(name, v):
    """v as a Python float, refused when finite but past float32's range
    (it would become inf in the params struct)."""
    v = float(v)
    if math.isfinite(v) and abs(v) > _FLT_MAX:
        raise _lib.AttnError(_lib.ATTN_ERR_ARG, "%s must be finite in float32, got %g" % (name, v))
    return v


def build_params(*, scale=None, is_causal=False, key_lengths=None, window=None,
                 dropout_p=0.0, training=None, seed=0, offset=0, impl=None,
                 num_threads=0, dtype=_lib.ATTN_F32, out_dtype=_lib.ATTN_F32,
                 softcap=None, alibi_slopes=None, sinks=None):
    """attn_sdpa_params (masks are attached by the caller). key_lengths,
    alibi_slopes and sinks must already be contiguous int64 / float32 arrays
    that the caller keeps alive; dtype / out_dtype are attn_dtype codes
    (dtype_code)."""
    p = _lib.attn_sdpa_params()
    if softcap is not None:  # the library refuses <= 0 and non-finite caps
        softcap = _f32_scalar("softcap", softcap)
        p.use_softcap = 1
        p.softcap = softcap
    if alibi_slopes is not None:
        p.alibi_slopes = alibi_slopes.ctypes.data_as(_lib.c_float_p)
    if sinks is not None:
        p.sinks = sinks.ctypes.data_as(_lib.c_float_p)
    p.dtype = dtype
    p.out_dtype = out_dtype
    if scale is not None:  # explicit, 0 included (every score 0)
        scale = _f32_scalar("scale", scale)
        p.use_scale = 1
        p.scale = scale
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
                         else int64_arg(left, "window left", _lib.ATTN_ERR_ARG))
        p.window_right = (_lib.ATTN_UNBOUNDED if right is None
                          else int64_arg(right, "window right", _lib.ATTN_ERR_ARG))
    p.dropout_p = float(dropout_p)
    if training is None:
        training = dropout_p > 0
    p.training = 1 if training else 0
    p.seed = uint64_arg(seed, "seed")
    p.offset = uint64_arg(offset, "offset")
    p.impl = _impl_code(impl)
    p.num_threads = as_ranged_int(num_threads, "num_threads", -2**31,
                                  2**31 - 1, _lib.ATTN_ERR_ARG, "an int")
    return p


class _Call:
    """The validated inputs of one SDPA call: 4-D views, params and the
    arrays they point into (kept alive as long as this object).

    Zero-size dims (the one rule of every entry point, PyTorch's results):
    the library takes sizes >= 1 only, so a zero dim is replaced by a
    stand-in of size 1 that the library runs on (which also validates every
    other argument with its message): Lk = 0 by one key that key_lengths 0
    hides (so each query sees no key: output 0, as the library gives any
    such row, and PyTorch's softmax over no keys gives too), Dk = 0 by
    zero query/key columns (every score 0: weights uniform over the visible
    keys, PyTorch's result), B, H, Lq, Dv = 0 by zero tensors whose results
    are dropped (those outputs have no elements). `sub` names the tensors
    that were replaced: their results are zeros of the caller's shape.
    """


_Q_DIMS, _K_DIMS, _V_DIMS = {"B", "H", "Lq", "Dk"}, {"B", "H", "Lk", "Dk"}, \
    {"B", "H", "Lk", "Dv"}


def _zeros_view(shape, bf16):
    return tensor_view(np.zeros(shape, np.uint16 if bf16 else np.float32),
                       "stand-in", bf16)


def per_head(x, name, heads, h_lib):
    """A per-query-head argument (alibi_slopes, sinks): 1-D with `heads`
    entries (the query's dim -3), as a float32 array of the library's h_lib
    heads (the leading dims after the first flattened: the values repeat
    for each outer index)."""
    a = as_numpy(x)
    if a.ndim != 1 or a.shape[0] != heads:
        raise ValueError("%s must be 1-D with one value per query head (%d), got "
                         "shape %s" % (name, heads, a.shape))
    if a.dtype.kind not in "fiu":
        raise ValueError("%s must be real numbers, got dtype %s" % (name, a.dtype))
    if heads == 0:  # zero heads: a stand-in head
        return np.zeros(max(h_lib, 1), np.float32)
    return np.ascontiguousarray(np.tile(a.astype(np.float32), h_lib // heads))


def fold_heads(d, heads):
    """The library's per-head gradient (h_lib values) summed back onto the
    caller's `heads` (the inverse of per_head's repetition)."""
    if heads == 0:
        return np.zeros(0, np.float32)
    return d.astype(np.float64).reshape(-1, heads).sum(0).astype(np.float32)


def needs_heads(query, enable_gqa, alibi_slopes, sinks):
    """3-D (H, L, E) inputs with a per-head argument or enable_gqa are run as
    (1, H, L, E) (dim -3 is the heads, as PyTorch reads it)."""
    return (np.ndim(query) == 3 and
            (enable_gqa or alibi_slopes is not None or sinks is not None))


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
             key_padding_lengths, window, seed, offset, impl, num_threads,
             stand_ins=False, dtype=None, out_dtype=None, enable_gqa=False,
             softcap=None, alibi_slopes=None, sinks=None):
    """_Call for these arguments. stand_ins=True applies the zero-size rule
    (see _Call; the caller maps results back with _result); without it a
    zero Lk or Dk reaches the library, which refuses it. dtype / out_dtype:
    as scaled_dot_product_attention's (out_dtype None: dtype's)."""
    c = _Call()
    c.dtype = dtype_code(dtype)
    c.out_dtype = (c.dtype if out_dtype is None
                   else dtype_code(out_dtype, "out_dtype"))
    if c.out_dtype == _lib.ATTN_BF16 and c.dtype != _lib.ATTN_BF16:
        raise ValueError("out_dtype='bf16' needs dtype='bf16' (bf16 query, key "
                         "and value)")
    c.bf16 = c.dtype == _lib.ATTN_BF16
    c.out_bf16 = c.out_dtype == _lib.ATTN_BF16
    c.q, c.tq = tensor_view(query, "query", c.bf16)
    c.k, c.tk = tensor_view(key, "key", c.bf16)
    c.v, c.tv = tensor_view(value, "value", c.bf16)
    c.lead = lead = c.q.shape[:-2]
    if enable_gqa:  # key and value: H_kv heads at dim -3, H_q % H_kv == 0
        kl_ = c.k.shape[:-2]
        if (len(lead) < 2 or kl_[:-1] != lead[:-1] or c.v.shape[:-2] != kl_ or
                kl_[-1] == 0 or lead[-1] % kl_[-1]):
            raise ValueError(
                "enable_gqa: query (..., H_q, Lq, E), key and value (..., H_kv, "
                "Lk, E) with the same other leading dims and H_q a multiple of "
                "H_kv; got shapes %s, %s, %s" % (c.q.shape, c.k.shape, c.v.shape))
    elif c.k.shape[:-2] != lead or c.v.shape[:-2] != lead:
        raise ValueError(
            "query, key and value must have the same leading dims: got shapes "
            "%s, %s, %s (different head counts need enable_gqa=True)"
            % (c.q.shape, c.k.shape, c.v.shape))
    c.Lq, c.Lk, c.Dv = c.q.shape[-2], c.k.shape[-2], c.v.shape[-1]
    Dk = c.q.shape[-1]
    B, H, Hk = int(c.tq.dim[0]), int(c.tq.dim[1]), int(c.tk.dim[1])
    c.shapes = (c.q.shape, c.k.shape, c.v.shape)
    dims = {"B": B, "H": H, "Lq": c.Lq, "Lk": c.Lk, "Dk": Dk, "Dv": c.Dv}
    zero = {n for n, d in dims.items() if d == 0} if stand_ins else set()
    c.note = ("zero-size %s: the library ran on size-1 stand-ins; "
              % ", ".join(n for n in dims if n in zero)) if zero else ""
    if zero:  # the checks the library makes, which a stand-in would pass
        if c.k.shape[-1] != Dk:
            raise _lib.AttnError(_lib.ATTN_ERR_SHAPE, "k head size %d != q head "
                                 "size %d" % (c.k.shape[-1], Dk))
        if c.v.shape[-2] != c.Lk:
            raise _lib.AttnError(_lib.ATTN_ERR_SHAPE, "v length %d != k length %d"
                                 % (c.v.shape[-2], c.Lk))
    c.sub = {"q": bool(zero & _Q_DIMS), "k": bool(zero & _K_DIMS),
             "v": bool(zero & _V_DIMS),
             "out": bool(zero & {"B", "H", "Lq", "Dv"}),
             "weights": bool(zero & {"B", "H", "Lq", "Lk"})}
    s = {n: max(d, 1) for n, d in dims.items()}
    c.out_shape = ((s["B"], s["H"], s["Lq"], s["Dv"]) if c.sub["out"]
                   else lead + (c.Lq, c.Dv))
    c.weights_shape = ((s["B"], s["H"], s["Lq"], s["Lk"]) if c.sub["weights"]
                       else lead + (c.Lq, c.Lk))
    if c.sub["q"]:
        c.q, c.tq = _zeros_view((s["B"], s["H"], s["Lq"], s["Dk"]), c.bf16)
    if c.sub["k"]:
        c.k, c.tk = _zeros_view((s["B"], max(Hk, 1), s["Lk"], s["Dk"]), c.bf16)
    if c.sub["v"]:
        c.v, c.tv = _zeros_view((s["B"], max(Hk, 1), s["Lk"], s["Dv"]), c.bf16)
    if "Dk" in zero and scale is None:
        scale = 1.0  # every score is 0 whatever the scale; 1/sqrt(0) is not

    c.keep = []

    kl = None
    if key_padding_lengths is not None:
        kl = as_numpy(key_padding_lengths)
        if kl.dtype.kind not in "iu" and not (kl.size == 0 and kl.dtype.kind == "f"):
            raise ValueError("key_padding_lengths must be integers, got dtype %s"
                             % kl.dtype)
        kl = kl.reshape(-1)
        if kl.shape[0] != B:
            raise ValueError(
                "key_padding_lengths needs one entry per batch element (%d, the "
                "first leading dim of query), got %d" % (B, kl.shape[0]))
        bad = np.flatnonzero((kl < 0) | (kl > c.Lk))
        if bad.size:  # the library's check, made before int64 could wrap
            b = int(bad[0])
            raise _lib.AttnError(
                _lib.ATTN_ERR_MASK, "key_lengths[%d] = %d outside [0, Lk=%d]"
                % (b, int(kl[b]), c.Lk))
        # a private aligned copy: the library reads it after this check
        kl = np.array(kl, dtype=np.int64, order="C")
        if "B" in zero:
            kl = None
    if "Lk" in zero:
        kl = np.zeros(s["B"], np.int64)  # the stand-in key is never seen
    c.key_lengths = kl

    # per-head arguments: heads = the query's dim -3 (1 without it)
    c.heads = c.shapes[0][-3] if len(c.shapes[0]) >= 3 else 1
    h_lib = int(c.tq.dim[1])
    c.alibi = (None if alibi_slopes is None else
               per_head(alibi_slopes, "alibi_slopes", c.heads, h_lib))
    c.sinks = None if sinks is None else per_head(sinks, "sinks", c.heads, h_lib)
    c.p = p = build_params(scale=scale, is_causal=is_causal, key_lengths=kl,
                           window=window, dropout_p=dropout_p, seed=seed,
                           offset=offset, impl=impl, num_threads=num_threads,
                           dtype=c.dtype, out_dtype=c.out_dtype, softcap=softcap,
                           alibi_slopes=c.alibi, sinks=c.sinks)

    if attn_mask is not None:
        m, is_bool = mask_array(attn_mask, "attn_mask")
        mb, mv = mask_view(m, lead, c.Lq, c.Lk, "attn_mask")
        c.keep.append((mb, mv))
        if c.sub["weights"]:
            pass  # a mask over no (query, key) pair: its shape was checked
        elif is_bool:
            p.bool_mask = ctypes.pointer(mv)
        else:
            p.add_mask = ctypes.pointer(mv)
    return c


def _result(c, name, arr, shape):
    """The caller's array for a result the library wrote into arr: arr
    itself, or zeros of the caller's shape (arr's dtype) where a stand-in
    was used."""
    if c.sub[name]:
        return np.zeros(shape, arr.dtype)
    return arr


def _set_path(info, note=""):
    _last.path = (_lib.IMPL_NAMES.get(info.impl, str(info.impl)),
                  note + info.reason.decode("utf-8", "replace"))


def _forward(c, out_t, weights, lse):
    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_forward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
        ctypes.byref(c.p), ctypes.byref(out_t), _lib.float_ptr(weights),
        _lib.float_ptr(lse), ctypes.byref(info), ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info, c.note)


def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None, *,
                                 key_padding_lengths=None, window=None,
                                 need_weights=False, seed=0, offset=0,
                                 impl=None, num_threads=0, dtype=None,
                                 out_dtype=None, enable_gqa=False, softcap=None,
                                 alibi_slopes=None, sinks=None):
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
    dtype: None / "float32", or "bf16": query, key and value are then uint16
      arrays of bfloat16 bit patterns (numpy has no bfloat16; make them with
      attn.bf16_from_float32, read them with attn.float32_from_bf16).
      Scores, softmax and accumulation stay float32 (see attn_sdpa_params
      in attn.h). out_dtype: the output's type, None = dtype's ("bf16":
      uint16 bits; "float32" with bf16 inputs: the fp32 tile unrounded).
      weights are float32 always.
    A query row with no visible key gets output 0 and weights 0 (PyTorch: NaN).
    Zero-size dims give PyTorch's results: B, H, Lq or Ev = 0 empty outputs,
    Lk = 0 output 0 (no query sees a key), E = 0 uniform weights over the
    visible keys (every score is 0); the arguments are validated all the same.

    Attention variants (attn.h; PyTorch's and FlashAttention's conventions;
    they combine with each other and with every option above). The heads
    are dim -3 of query (a 3-D query is (H, L, E)):
    enable_gqa: key and value may have H_kv heads (dim -3), H_q % H_kv == 0;
      query head h reads K/V head h // (H_q / H_kv) (PyTorch 2.5's
      enable_gqa, repeat_interleave's order).
    softcap: c > 0: each scaled score s becomes c * tanh(s / c), before
      alibi_slopes and the masks (Gemma 2).
    alibi_slopes: H_q slopes m_h: -m_h * |i + Lk - Lq - j| is added after
      soft-capping (ALiBi, FlashAttention's convention).
    sinks: H_q logits: each joins its head's softmax denominators and
      carries no value (gpt-oss); weights then sum to 1 - p_sink per row, and
      a row that sees no key gets output 0.
    """
    if needs_heads(query, enable_gqa, alibi_slopes, sinks):
        r = scaled_dot_product_attention(
            as_numpy(query)[None], as_numpy(key)[None], as_numpy(value)[None],
            attn_mask, dropout_p, is_causal, scale,
            key_padding_lengths=key_padding_lengths, window=window,
            need_weights=need_weights, seed=seed, offset=offset, impl=impl,
            num_threads=num_threads, dtype=dtype, out_dtype=out_dtype,
            enable_gqa=enable_gqa, softcap=softcap, alibi_slopes=alibi_slopes,
            sinks=sinks)
        return tuple(a[0] for a in r) if need_weights else r[0]
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
                 key_padding_lengths, window, seed, offset, impl, num_threads,
                 stand_ins=True, dtype=dtype, out_dtype=out_dtype,
                 enable_gqa=enable_gqa, softcap=softcap,
                 alibi_slopes=alibi_slopes, sinks=sinks)
    out, tout = out_tensor(c.out_shape, c.out_bf16)
    weights = None
    if need_weights:
        weights = np.empty(c.weights_shape, dtype=np.float32)
    _forward(c, tout, weights, None)
    out = _result(c, "out", out, c.lead + (c.Lq, c.Dv))
    if need_weights:
        weights = _result(c, "weights", weights, c.lead + (c.Lq, c.Lk))
        return out, weights
    return out


def scaled_dot_product_attention_grad(grad_out, query, key, value,
                                      attn_mask=None, dropout_p=0.0,
                                      is_causal=False, scale=None, *,
                                      key_padding_lengths=None, window=None,
                                      seed=0, offset=0, impl=None,
                                      num_threads=0, dtype=None,
                                      out_dtype=None, enable_gqa=False,
                                      softcap=None, alibi_slopes=None,
                                      sinks=None):
    """Gradients of scaled_dot_product_attention: (dq, dk, dv), float32
    arrays with the shapes of query, key and value (float32 for bf16 inputs
    too: the exact gradients of the bf16 values' attention; round them with
    attn.bf16_from_float32 where bf16 is wanted).

    grad_out has the shape of the forward's output (..., Lq, Ev). Every other
    argument means what it means for scaled_dot_product_attention and must
    be the same as in the forward being differentiated; in particular the
    same dropout_p, seed and offset give the same dropout mask, so these are
    the gradients of exactly that forward's output. The forward is run again
    here (attn_sdpa_forward, saving the per-row log-sum-exp), then
    attn_sdpa_backward. A query row that sees no key contributes zero
    gradient (its output is the constant 0). dtype / out_dtype as in the
    forward; grad_out is in out_dtype (uint16 bits for "bf16").
    With sinks: (dq, dk, dv, dsinks), dsinks float32 (H_q,). With
    enable_gqa, dk and dv have key's and value's H_kv heads (each the sum
    over its group of query heads).
    """
    if needs_heads(query, enable_gqa, alibi_slopes, sinks):
        r = scaled_dot_product_attention_grad(
            as_numpy(grad_out)[None], as_numpy(query)[None], as_numpy(key)[None],
            as_numpy(value)[None], attn_mask, dropout_p, is_causal, scale,
            key_padding_lengths=key_padding_lengths, window=window, seed=seed,
            offset=offset, impl=impl, num_threads=num_threads, dtype=dtype,
            out_dtype=out_dtype, enable_gqa=enable_gqa, softcap=softcap,
            alibi_slopes=alibi_slopes, sinks=sinks)
        return tuple(a[0] for a in r[:3]) + tuple(r[3:])
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
                 key_padding_lengths, window, seed, offset, impl, num_threads,
                 stand_ins=True, dtype=dtype, out_dtype=out_dtype,
                 enable_gqa=enable_gqa, softcap=softcap,
                 alibi_slopes=alibi_slopes, sinks=sinks)
    out_shape = c.lead + (c.Lq, c.Dv)
    g = (bf16_array(grad_out, "grad_out") if c.out_bf16
         else as_float_array(grad_out, "grad_out (in out_dtype, float32 here)",
                             bf16_hint="out_dtype='bf16'"))
    if g.shape != out_shape:
        raise ValueError("grad_out must have the shape of the output %s, got %s"
                         % (out_shape, g.shape))
    out, tout = out_tensor(c.out_shape, c.out_bf16)
    if c.sub["out"]:  # no output element: nothing flows back
        _forward(c, tout, None, None)  # (validates every argument)
        return tuple(np.zeros(sh, np.float32) for sh in c.shapes) + (
            () if sinks is None else (np.zeros(c.heads, np.float32),))
    g, tg = tensor_view(g, "grad_out", c.out_bf16, bf16_hint="out_dtype='bf16'")
    dsinks = None
    if c.sinks is not None:
        dsinks = np.zeros(c.sinks.shape, np.float32)
        c.p.d_sinks = dsinks.ctypes.data_as(_lib.c_float_p)

    dq, tdq = out_tensor(c.q.shape)
    dk, tdk = out_tensor(c.k.shape)
    dv, tdv = out_tensor(c.v.shape)
    lse = np.empty(c.out_shape[:-1], dtype=np.float32)
    _forward(c, tout, None, lse)

    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_backward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
        ctypes.byref(tout), _lib.float_ptr(lse), ctypes.byref(tg),
        ctypes.byref(c.p), ctypes.byref(tdq), ctypes.byref(tdk),
        ctypes.byref(tdv), ctypes.byref(info), ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info, c.note)
    grads = (_result(c, "q", dq, c.shapes[0]), _result(c, "k", dk, c.shapes[1]),
             _result(c, "v", dv, c.shapes[2]))
    if dsinks is None:
        return grads
    return grads + (fold_heads(dsinks, c.heads),)


# ------------------------------------------------ packed variable-length


def _cu_array(x, name):
    """A private int64 copy of cumulative lengths (1-D integers)."""
    a = as_numpy(x)
    if a.ndim != 1 or (a.dtype.kind not in "iu" and
                       not (a.size == 0 and a.dtype.kind == "f")):
        raise ValueError("%s must be a 1-D array of integers (batch + 1 "
                         "cumulative lengths), got shape %s, dtype %s"
                         % (name, a.shape, a.dtype))
    if a.dtype.kind == "u" and a.size and int(a.max()) > 2**63 - 1:
        raise _lib.AttnError(_lib.ATTN_ERR_OVERFLOW, "%s: %d does not fit "
                             "in int64" % (name, int(a.max())))
    return np.array(a, dtype=np.int64, order="C")


def _varlen_prepare(query, key, value, cu_seqlens_q, cu_seqlens_k, dropout_p,
                    is_causal, scale, window, seed, offset, impl, num_threads,
                    enable_gqa=False, softcap=None, alibi_slopes=None, sinks=None):
    c = _Call()
    c.q, c.tq = packed_view(query, "query")
    c.k, c.tk = packed_view(key, "key")
    c.v, c.tv = packed_view(value, "value")
    if not enable_gqa and (c.k.shape[1] != c.q.shape[1] or
                           c.v.shape[1] != c.q.shape[1]):
        raise ValueError("query, key and value must have the same head count: "
                         "got shapes %s, %s, %s (different head counts need "
                         "enable_gqa=True)" % (c.q.shape, c.k.shape, c.v.shape))
    c.heads = c.q.shape[1]
    c.alibi = (None if alibi_slopes is None else
               per_head(alibi_slopes, "alibi_slopes", c.heads, c.heads))
    c.sinks = None if sinks is None else per_head(sinks, "sinks", c.heads, c.heads)
    c.cq = _cu_array(cu_seqlens_q, "cu_seqlens_q")
    c.ck = None if cu_seqlens_k is None else _cu_array(cu_seqlens_k,
                                                        "cu_seqlens_k")
    if c.ck is not None and c.ck.shape != c.cq.shape:
        raise ValueError("cu_seqlens_k has %d entries, cu_seqlens_q %d: one "
                         "per sequence and one more" % (c.ck.size, c.cq.size))
    c.batch = c.cq.size - 1  # < 1 is refused by the library, which says so
    c.p = build_params(scale=scale, is_causal=is_causal, window=window,
                       dropout_p=dropout_p, seed=seed, offset=offset,
                       impl=impl, num_threads=num_threads, softcap=softcap,
                       alibi_slopes=c.alibi, sinks=c.sinks)
    return c


def _cu_ptr(a):
    return None if a is None else a.ctypes.data_as(_lib.c_int64_p)


def _varlen_forward(c, out_t, weights, lse):
    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_varlen_forward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv), c.batch,
        _cu_ptr(c.cq), _cu_ptr(c.ck), ctypes.byref(c.p), ctypes.byref(out_t),
        _lib.float_ptr(weights), _lib.float_ptr(lse), ctypes.byref(info),
        ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info)


def scaled_dot_product_attention_varlen(query, key, value, cu_seqlens_q,
                                        cu_seqlens_k=None, dropout_p=0.0,
                                        is_causal=False, scale=None, *,
                                        window=None, need_weights=False,
                                        seed=0, offset=0, impl=None,
                                        num_threads=0, enable_gqa=False,
                                        softcap=None, alibi_slopes=None,
                                        sinks=None):
    """Attention over sequences packed back to back (FlashAttention's
    varlen layout): query (total_q, H, E), key (total_k, H, E), value
    (total_k, H, Ev); sequence s holds query rows cu_seqlens_q[s] ..
    cu_seqlens_q[s+1] - 1 and key rows cu_seqlens_k[s] .. cu_seqlens_k[s+1]
    - 1 (cu_seqlens_k None: cu_seqlens_q) and attends only within itself.
    cu_seqlens_*: batch + 1 integers, 0 first, non-decreasing (empty
    sequences allowed), the total last. Returns out (total_q, H, Ev)
    float32, or (out, weights) with weights a list of batch arrays
    (H, Lq_s, Lk_s) when need_weights.

    is_causal, scale, window, dropout_p, seed, offset, impl, num_threads
    act on each sequence as scaled_dot_product_attention does on one batch
    element (causal bottom-right aligned when Lq_s < Lk_s); the dropout mask
    of sequence s is that of batch element s of the padded call with the
    same seed and offset. The cost is Σ Lq_s·Lk_s, not total_q·total_k.
    enable_gqa (key and value (total_k, H_kv, E)), softcap, alibi_slopes
    (positions counted within each sequence) and sinks as for
    scaled_dot_product_attention.
    """
    c = _varlen_prepare(query, key, value, cu_seqlens_q, cu_seqlens_k,
                        dropout_p, is_causal, scale, window, seed, offset,
                        impl, num_threads, enable_gqa, softcap, alibi_slopes,
                        sinks)
    Tq, H, Tk = c.q.shape[0], c.q.shape[1], c.k.shape[0]
    out = np.empty((Tq, H, c.v.shape[2]), np.float32)
    _, tout = packed_view(out, "out")
    weights = None
    if need_weights:
        ck = c.cq if c.ck is None else c.ck
        lq = [max(int(b) - int(a), 0) for a, b in zip(c.cq[:-1], c.cq[1:])]
        lk = [max(int(b) - int(a), 0) for a, b in zip(ck[:-1], ck[1:])]
        # (lengths the library refuses never reach a write: bounded by the
        # packed sizes, which hold every valid batch)
        n = min(sum(H * a * b for a, b in zip(lq, lk)), H * Tq * Tk)
        weights = np.empty(max(n, 1), np.float32)
    _varlen_forward(c, tout, weights, None)
    if not need_weights:
        return out
    blocks, at = [], 0
    for a, b in zip(lq, lk):
        blocks.append(weights[at:at + H * a * b].reshape(H, a, b))
        at += H * a * b
    return out, blocks


def scaled_dot_product_attention_varlen_grad(grad_out, query, key, value,
                                             cu_seqlens_q, cu_seqlens_k=None,
                                             dropout_p=0.0, is_causal=False,
                                             scale=None, *, window=None,
                                             seed=0, offset=0, impl=None,
                                             num_threads=0, enable_gqa=False,
                                             softcap=None, alibi_slopes=None,
                                             sinks=None):
    """Gradients of scaled_dot_product_attention_varlen with the same
    arguments: (dq, dk, dv), float32 (total, H, E) like query, key, value.
    grad_out has the output's shape (total_q, H, Ev). The forward runs again
    here (keeping the log-sum-exp), then attn_sdpa_varlen_backward; the same
    seed and offset give the same dropout mask. With sinks: (dq, dk, dv,
    dsinks), dsinks (H,) summed over every sequence's rows."""
    c = _varlen_prepare(query, key, value, cu_seqlens_q, cu_seqlens_k,
                        dropout_p, is_causal, scale, window, seed, offset,
                        impl, num_threads, enable_gqa, softcap, alibi_slopes,
                        sinks)
    Tq, H = c.q.shape[0], c.q.shape[1]
    out_shape = (Tq, H, c.v.shape[2])
    g = as_float_array(grad_out, "grad_out", bf16_hint=None)
    if g.shape != out_shape:
        raise ValueError("grad_out must have the shape of the output %s, got %s"
                         % (out_shape, g.shape))
    g, tg = packed_view(g, "grad_out")
    out = np.empty(out_shape, np.float32)
    _, tout = packed_view(out, "out")
    lse = np.empty((H, Tq), np.float32)
    _varlen_forward(c, tout, None, lse)
    return _varlen_backward(c, tout, lse, tg, with_sinks=sinks is not None)


def _varlen_backward(c, tout, lse, tg, with_sinks=False):
    """(dq, dk, dv) of a _varlen_prepare call from the forward's out view,
    its lse (H, total_q) and grad_out's view; with_sinks: and dsinks (H,)
    (None when the call has no sinks)."""
    grads = [np.empty(a.shape, np.float32) for a in (c.q, c.k, c.v)]
    tds = [packed_view(a, "grad")[1] for a in grads]
    dsinks = None
    if c.sinks is not None:
        dsinks = np.zeros(c.sinks.shape, np.float32)
        c.p.d_sinks = dsinks.ctypes.data_as(_lib.c_float_p)
    info = _lib.attn_sdpa_info()
    err = _lib.attn_error()
    st = _lib.lib.attn_sdpa_varlen_backward(
        ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
        ctypes.byref(tout), _lib.float_ptr(lse), ctypes.byref(tg), c.batch,
        _cu_ptr(c.cq), _cu_ptr(c.ck), ctypes.byref(c.p), ctypes.byref(tds[0]),
        ctypes.byref(tds[1]), ctypes.byref(tds[2]), ctypes.byref(info),
        ctypes.byref(err))
    _lib.check(st, err)
    _set_path(info)
    return tuple(grads) + ((dsinks,) if with_sinks else ())

"""attn.torch: libattn inside PyTorch autograd (CPU, float32; bfloat16 SDPA).

    import attn.torch
    out = attn.torch.scaled_dot_product_attention(q, k, v, attn_mask=None,
              dropout_p=0.0, is_causal=False, scale=None, *,
              key_padding_lengths=None, window=None, seed=None, offset=0,
              enable_gqa=False, softcap=None, alibi_slopes=None, sinks=None)
    out = attn.torch.scaled_dot_product_attention_varlen(q, k, v, cu_seqlens_q,
              cu_seqlens_k=None, dropout_p=0.0, is_causal=False, scale=None, *,
              window=None, seed=None, offset=0)     # packed (total, H, E) rows
    mha = attn.torch.MultiheadAttention(embed_dim, num_heads, dropout=0.0,
              bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None,
              vdim=None, batch_first=False,      # torch.nn.MultiheadAttention's
              num_kv_heads=None)                 # + grouped-query attention
    out, weights = mha(query, key, value, key_padding_mask=None,
                       need_weights=True, attn_mask=None,
                       average_attn_weights=True, is_causal=False)

Both are differentiable with torch autograd: the forward and the backward
are libattn's (attn_sdpa_forward/backward; attn_mha_forward/backward).
Inputs are read in place through their strides (no copy for contiguous
tensors, transposes or slices; leading dims that cannot be merged into one
stride are copied first). Threads: torch.get_num_threads() per call.

Dropout: the mask of element (b, h, i, j) is a pure function of (seed,
offset) (see attn_sdpa_params in attn.h); seed=None draws the seed from
torch's default generator, so torch.manual_seed reproduces it. The backward
regenerates the forward's mask.

bfloat16: scaled_dot_product_attention takes torch.bfloat16 query, key and
value (all three) and returns a bfloat16 output; scores, softmax and
accumulation run in float32 (attn_sdpa_params in attn.h). The gradients come
back in bfloat16 too: libattn's float32 gradients rounded once (to nearest,
ties to even). A bfloat16 attn_mask is read as float32.

Refused with attn.torch.UnsupportedError (a NotImplementedError), never
silently worked around: tensors not on the CPU, dtypes other than float32
(and bfloat16 for scaled_dot_product_attention),
non-strided layouts, gradients w.r.t. a mask or w.r.t. the returned attention
weights, double backward, add_bias_kv, add_zero_attn. The message names the
alternative (torch's own attention, or a conversion).

Zero-size dims give PyTorch 1.13's results (attn's one rule, see
attn.functional). Differences from PyTorch: a query row whose keys are all
masked gets output 0 and zero gradient (PyTorch: NaN); is_causal is bottom-right aligned (query i
sees keys j <= i + Lk - Lq; the same as PyTorch's when Lq == Lk) and may be
combined with attn_mask; the weights MultiheadAttention returns are before
dropout (PyTorch 1.13 returns them after).

This module needs torch; `import attn` alone does not import it.
"""
import ctypes
import functools
import threading

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import _lib
from ._views import mask_array, mask_view, out_tensor, packed_view, tensor_view
from .functional import (_forward, _prepare, _result, _set_path, _varlen_backward,
                         _varlen_forward, _varlen_prepare, build_params, fold_heads)

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_varlen",
           "MultiheadAttention", "UnsupportedError"]


class UnsupportedError(NotImplementedError):
    """A tensor, option or use that attn.torch does not support; the message
    names the alternative."""


_TORCH_MATH = ("torch's math path (torch.softmax(q @ k.transpose(-2, -1) * "
               "scale + mask, -1) @ v)")
_TORCH_MHA = "torch.nn.MultiheadAttention"
_last = threading.local()


def _last_copied():
    """Names of the inputs the last scaled_dot_product_attention call in this
    thread had to copy (leading dims not mergeable into one stride); () when
    every input was read in place."""
    return getattr(_last, "copied", ())


def _check_tensor(t, name, what="float32", alt=_TORCH_MATH):
    """t must be a strided CPU tensor: float32, for what="sdpa" float32 or
    bfloat16, for what="mask" bool or floating, for what="mha_mask" also
    uint8 (torch's byte masks). alt: the alternative the error names."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("attn.torch: %s must be a torch.Tensor, got %s"
                        % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise UnsupportedError(
            "attn.torch: %s is on %s; attn runs on the CPU only. Move the "
            "tensors with .cpu(), or use %s on that device" % (name, t.device, alt))
    if t.layout != torch.strided:
        raise UnsupportedError("attn.torch: %s has layout %s; convert it with "
                               ".to_dense()" % (name, t.layout))
    if what in ("mask", "mha_mask"):
        kinds = (torch.bool, torch.uint8) if what == "mha_mask" else (torch.bool,)
        if t.dtype not in kinds and not t.is_floating_point():
            raise ValueError("attn.torch: %s must be %s or floating point, got %s"
                             % (name, " or ".join(map(str, kinds)), t.dtype))
        if t.requires_grad:
            raise UnsupportedError(
                "attn.torch: %s requires grad; attn has no gradient w.r.t. a "
                "mask. Pass %s.detach(), or use %s for that gradient"
                % (name, name, alt))
    elif what == "sdpa" and t.dtype == torch.bfloat16:
        pass
    elif t.dtype != torch.float32:
        if what == "sdpa":
            alt += " (attn takes float32 and bfloat16)"
        raise UnsupportedError(
            "attn.torch: %s has dtype %s; attn computes in float32 only. "
            "Convert with .float(), or use %s for %s" % (name, t.dtype, alt, t.dtype))


def _np(t):
    """numpy view of a CPU tensor's memory, with its strides (no copy);
    bfloat16 as uint16 bit patterns (numpy has no bfloat16)."""
    t = t.detach().resolve_neg().resolve_conj()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_np(a):
    """torch tensor over a numpy array's memory; uint16 as bfloat16 bits."""
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _shares(a, t):
    return a is not None and a.size > 0 and a.ctypes.data == t.data_ptr()


def _draw_seed():
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


def _check_dropout(p, name):
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError("attn.torch: %s must be in [0, 1), got %r" % (name, p))
    return p


class _RefuseDoubleBackward(torch.autograd.Function):
    """Identity on a first-order gradient computed by libattn; differentiating
    it again raises (create_graph=True is fine until that happens)."""

    @staticmethod
    def forward(ctx, grad, *inputs):
        return grad.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise UnsupportedError(
            "attn.torch: double backward (differentiating a gradient of attn's "
            "attention) is not supported; attn's backward is not itself "
            "differentiable. For higher-order gradients use %s or %s"
            % (_TORCH_MATH, _TORCH_MHA))


def _maybe_refuse(grads, inputs):
    """Under create_graph=True, chain each gradient to a node that refuses
    to be differentiated, so a second-order term is never silently dropped."""
    if not torch.is_grad_enabled():
        return grads
    deps = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not deps:
        return grads
    return tuple(None if g is None else _RefuseDoubleBackward.apply(g, *deps)
                 for g in grads)


# ---------------------------------------------------------------- SDPA


class _SDPAOptions:
    __slots__ = ("dropout_p", "is_causal", "scale", "key_lengths", "window",
                 "seed", "offset", "num_threads", "enable_gqa", "softcap",
                 "alibi_slopes")


class _SDPAFunction(torch.autograd.Function):
    """Zero-size dims follow attn's one rule (PyTorch 1.13's results; see
    functional._Call): the library runs on size-1 stand-ins and results for
    the replaced tensors are zeros of the caller's shape."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, sinks, o):
        bf16 = "bf16" if query.dtype == torch.bfloat16 else None
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bfloat16:
            mask = mask.float()  # numpy has no bfloat16 (the values are exact)
        c = _prepare(_np(query), _np(key), _np(value),
                     None if mask is None else _np(mask),
                     o.dropout_p, o.is_causal, o.scale, o.key_lengths, o.window,
                     o.seed, o.offset, None, o.num_threads, stand_ins=True,
                     dtype=bf16, enable_gqa=o.enable_gqa, softcap=o.softcap,
                     alibi_slopes=o.alibi_slopes,
                     sinks=None if sinks is None else _np(sinks.float()))
        # stand-ins are not copies of an input
        _last.copied = tuple(
            n for n, a, t, sub in (("query", c.q, query, c.sub["q"]),
                                   ("key", c.k, key, c.sub["k"]),
                                   ("value", c.v, value, c.sub["v"]))
            if t.numel() and not sub and not _shares(a, t))
        out_np, c.tout = out_tensor(c.out_shape, c.out_bf16)
        lse_np = np.empty(c.out_shape[:-1], dtype=np.float32)
        _forward(c, c.tout, None, lse_np)
        out = _from_np(_result(c, "out", out_np, c.lead + (c.Lq, c.Dv)))
        lse = torch.from_numpy(lse_np)
        ctx.call = c
        # saved for autograd's in-place checks: c's views read this memory
        ctx.save_for_backward(query, key, value, attn_mask, sinks, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, _, sinks, out, lse = ctx.saved_tensors
        c = ctx.call
        need = ctx.needs_input_grad[:3]
        need_s = sinks is not None and ctx.needs_input_grad[4]
        ins = (query, key, value) + ((sinks,) if sinks is not None else ())
        if c.sub["out"] or grad_out is None or not (any(need) or need_s):
            grads = tuple(torch.zeros_like(t) if n else None
                          for t, n in zip((query, key, value), need))
            grads = _maybe_refuse(
                grads + (torch.zeros_like(sinks) if need_s else None,), ins)
            return grads[:3] + (None, grads[3], None)
        if grad_out.dtype != out.dtype:
            grad_out = grad_out.to(out.dtype)
        g, tg = tensor_view(_np(grad_out), "grad_out", c.out_bf16)
        dq, tdq = out_tensor(c.q.shape)
        dk, tdk = out_tensor(c.k.shape)
        dv, tdv = out_tensor(c.v.shape)
        dsinks = None
        if c.sinks is not None:
            dsinks = np.zeros(c.sinks.shape, np.float32)
            c.p.d_sinks = dsinks.ctypes.data_as(_lib.c_float_p)
        info = _lib.attn_sdpa_info()
        err = _lib.attn_error()
        st = _lib.lib.attn_sdpa_backward(
            ctypes.byref(c.tq), ctypes.byref(c.tk), ctypes.byref(c.tv),
            ctypes.byref(c.tout), _lib.float_ptr(lse.numpy()), ctypes.byref(tg),
            ctypes.byref(c.p), ctypes.byref(tdq), ctypes.byref(tdk),
            ctypes.byref(tdv), ctypes.byref(info), ctypes.byref(err))
        _lib.check(st, err)
        _set_path(info, c.note)
        # bf16 inputs: the fp32 gradients rounded once, in the inputs' dtype
        grads = tuple(torch.from_numpy(_result(c, name, a, shape)).to(t.dtype)
                      if n else None
                      for name, a, shape, n, t in zip("qkv", (dq, dk, dv), c.shapes,
                                                      need, (query, key, value)))
        ds = (torch.from_numpy(fold_heads(dsinks, c.heads)).to(sinks.dtype)
              if need_s else None)
        grads = _maybe_refuse(grads + (ds,), ins)
        return grads[:3] + (None, grads[3], None)


def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None, *,
                                 key_padding_lengths=None, window=None,
                                 seed=None, offset=0, enable_gqa=False,
                                 softcap=None, alibi_slopes=None, sinks=None):
    """softmax(query @ keyᵀ * scale + masks) @ value with torch autograd.

    query (..., Lq, E), key (..., Lk, E), value (..., Lk, Ev): CPU float32
    tensors, or all three bfloat16, with the same leading dims (zero or
    more). Returns (..., Lq, Ev) in their dtype; bfloat16 gradients are
    libattn's float32 gradients rounded to bfloat16.
    attn_mask: bool (True = takes part) or floating (added to the scaled
      scores), broadcastable to (..., Lq, Lk); no gradient flows to it.
    is_causal: query i sees keys j <= i + Lk - Lq.
    scale: None -> 1/sqrt(E).
    key_padding_lengths: ints, one per element of the first leading dim:
      keys j >= length do not take part.
    window: (left, right): query i (absolute position i + Lk - Lq) sees keys
      in [pos - left, pos + right]; None on a side = unbounded.
    dropout_p: dropout on the weights (applied whenever dropout_p > 0, as
      PyTorch's functional does), in [0, 1). seed/offset key the mask; seed
      None draws one from torch's default generator.
    enable_gqa, softcap, alibi_slopes, sinks: the attention variants of
      attn.scaled_dot_product_attention (heads at dim -3; PyTorch 2.5's
      enable_gqa). sinks: a tensor of H_q logits, differentiable (a sinks
      tensor that requires grad gets .grad); alibi_slopes: H_q values (a
      tensor or a sequence), a fixed bias without gradient.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(t, name, "sdpa")
    if query.dim() == 3 and (enable_gqa or alibi_slopes is not None or
                             sinks is not None):  # (H, L, E): heads at dim -3
        return scaled_dot_product_attention(
            query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), attn_mask,
            dropout_p, is_causal, scale, key_padding_lengths=key_padding_lengths,
            window=window, seed=seed, offset=offset, enable_gqa=enable_gqa,
            softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks).squeeze(0)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            sinks = torch.as_tensor(sinks, dtype=torch.float32)
        if sinks.device.type != "cpu" or not sinks.is_floating_point():
            raise UnsupportedError("attn.torch: sinks must be a floating CPU "
                                   "tensor, got %s on %s" % (sinks.dtype, sinks.device))
    if isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = alibi_slopes.detach().cpu().float().numpy()
    if not query.dtype == key.dtype == value.dtype:
        raise UnsupportedError(
            "attn.torch: query, key and value must have one dtype (float32 or "
            "bfloat16), got %s, %s, %s; convert them with .to()"
            % (query.dtype, key.dtype, value.dtype))
    if attn_mask is not None:
        _check_tensor(attn_mask, "attn_mask", "mask")
    o = _SDPAOptions()
    o.dropout_p = _check_dropout(dropout_p, "dropout_p")
    o.is_causal = bool(is_causal)
    o.scale = scale
    if key_padding_lengths is not None:
        if isinstance(key_padding_lengths, torch.Tensor):
            key_padding_lengths = key_padding_lengths.detach().cpu()
        key_padding_lengths = np.array(key_padding_lengths, copy=True)
    o.key_lengths = key_padding_lengths
    o.window = window
    o.seed = _draw_seed() if (seed is None and o.dropout_p > 0) else (seed or 0)
    o.offset = offset
    o.num_threads = torch.get_num_threads()
    o.enable_gqa = bool(enable_gqa)
    o.softcap = softcap
    o.alibi_slopes = alibi_slopes
    return _SDPAFunction.apply(query, key, value, attn_mask, sinks, o)


class _VarlenOptions:
    __slots__ = ("cu_q", "cu_k", "dropout_p", "is_causal", "scale", "window",
                 "seed", "offset", "num_threads", "enable_gqa", "softcap",
                 "alibi_slopes")


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, sinks, o):
        c = _varlen_prepare(_np(query), _np(key), _np(value), o.cu_q, o.cu_k,
                            o.dropout_p, o.is_causal, o.scale, o.window, o.seed,
                            o.offset, None, o.num_threads, o.enable_gqa, o.softcap,
                            o.alibi_slopes,
                            None if sinks is None else _np(sinks.float()))
        Tq, H = c.q.shape[0], c.q.shape[1]
        out_np = np.empty((Tq, H, c.v.shape[2]), np.float32)
        _, c.tout = packed_view(out_np, "out")
        lse_np = np.empty((H, Tq), np.float32)
        _varlen_forward(c, c.tout, None, lse_np)
        out, lse = torch.from_numpy(out_np), torch.from_numpy(lse_np)
        ctx.call = c
        ctx.save_for_backward(query, key, value, sinks, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, sinks, _, lse = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        need_s = sinks is not None and ctx.needs_input_grad[3]
        ins = (query, key, value) + ((sinks,) if sinks is not None else ())
        if grad_out is None or not (any(need) or need_s):
            grads = tuple(torch.zeros_like(t) if n else None
                          for t, n in zip((query, key, value), need))
            grads = _maybe_refuse(
                grads + (torch.zeros_like(sinks) if need_s else None,), ins)
            return grads + (None,)
        if grad_out.dtype != torch.float32:
            grad_out = grad_out.float()
        g, tg = packed_view(_np(grad_out), "grad_out")
        dq, dk, dv, ds = _varlen_backward(ctx.call, ctx.call.tout, lse.numpy(), tg,
                                          with_sinks=True)
        grads = tuple(torch.from_numpy(a) if n else None
                      for a, n in zip((dq, dk, dv), need))
        grads += (torch.from_numpy(ds).to(sinks.dtype) if need_s else None,)
        return _maybe_refuse(grads, ins) + (None,)


def scaled_dot_product_attention_varlen(query, key, value, cu_seqlens_q,
                                        cu_seqlens_k=None, dropout_p=0.0,
                                        is_causal=False, scale=None, *,
                                        window=None, seed=None, offset=0,
                                        enable_gqa=False, softcap=None,
                                        alibi_slopes=None, sinks=None):
    """attn.scaled_dot_product_attention_varlen with torch autograd: query
    (total_q, H, E), key (total_k, H, E), value (total_k, H, Ev), CPU
    float32 tensors; returns (total_q, H, Ev). cu_seqlens_q / cu_seqlens_k
    (None: the same) are integer tensors or sequences of batch + 1 entries
    (no gradient). seed None draws one from torch's default generator.
    enable_gqa (key, value (total_k, H_kv, E)), softcap, alibi_slopes and
    sinks (differentiable) as for scaled_dot_product_attention."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(t, name)
    o = _VarlenOptions()

    def cu(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        return None if x is None else np.array(x, copy=True)
    o.cu_q, o.cu_k = cu(cu_seqlens_q), cu(cu_seqlens_k)
    o.dropout_p = _check_dropout(dropout_p, "dropout_p")
    o.is_causal = bool(is_causal)
    o.scale = scale
    o.window = window
    o.seed = _draw_seed() if (seed is None and o.dropout_p > 0) else (seed or 0)
    o.offset = offset
    o.num_threads = torch.get_num_threads()
    o.enable_gqa = bool(enable_gqa)
    o.softcap = softcap
    if isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = alibi_slopes.detach().cpu().float().numpy()
    o.alibi_slopes = alibi_slopes
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks, dtype=torch.float32)
    return _VarlenFunction.apply(query, key, value, sinks, o)


# ---------------------------------------------------------------- MHA


def _fptr(t, elem_offset=0):
    return ctypes.cast(t.data_ptr() + 4 * elem_offset, _lib.c_float_p)


class _MHACall:
    """One forward's config, params (masks attached, arrays kept alive),
    shapes and which of query/key/value are the same tensor."""


def _weights_struct(s, params):
    """attn_mha_weights over contiguous float32 tensors params =
    (in_proj_weight or q_proj_weight, k_proj_weight, v_proj_weight,
    in_proj_bias, out_proj.weight, out_proj.bias); k/v None when packed,
    biases None without bias. The packed in-projection is [E + 2 Ekv, E],
    the bias [E + 2 Ekv] (Ekv = E without grouped-query attention)."""
    E, Ekv = s.E, s.Ekv
    w_in, w_k, w_v, b_in, w_o, b_o = params
    w = _lib.attn_mha_weights()
    w.w_q = _fptr(w_in)
    w.w_k = _fptr(w_in, E * E) if w_k is None else _fptr(w_k)
    w.w_v = _fptr(w_in, (E + Ekv) * E) if w_v is None else _fptr(w_v)
    w.w_o = _fptr(w_o)
    if b_in is not None:
        w.b_q, w.b_k, w.b_v = _fptr(b_in), _fptr(b_in, E), _fptr(b_in, E + Ekv)
        w.b_o = _fptr(b_o)
    return w


def _mha_forward_c(s, q, k, v, params, cache):
    """attn_mha_forward on contiguous [B, L, *] tensors -> (out, weights)."""
    out = torch.empty((s.B, s.Lq, s.E), dtype=torch.float32)
    if s.mode == _lib.ATTN_WEIGHTS_AVERAGE:
        weights = torch.empty((s.B, s.Lq, s.Lk), dtype=torch.float32)
    elif s.mode == _lib.ATTN_WEIGHTS_PER_HEAD:
        weights = torch.empty((s.B, s.H, s.Lq, s.Lk), dtype=torch.float32)
    else:
        weights = torch.empty(0, dtype=torch.float32)
    w = _weights_struct(s, params)
    err = _lib.attn_error()
    st = _lib.lib.attn_mha_forward(
        ctypes.byref(s.config), ctypes.byref(w), s.B, s.Lq, s.Lk,
        _fptr(q), _fptr(k), _fptr(v), ctypes.byref(s.p), _fptr(out), s.mode,
        _fptr(weights) if weights.numel() else None,
        None if cache is None else _fptr(cache), ctypes.byref(err))
    _lib.check(st, err)
    return out, weights


class _MHAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, query, key, value, *params):
        ctx.set_materialize_grads(False)
        q = query.contiguous()
        k = q if s.same_qk else key.contiguous()
        v = q if s.same_qv else (k if s.same_kv else value.contiguous())
        pc = tuple(None if t is None else t.contiguous() for t in params)
        n = ctypes.c_size_t()
        err = _lib.attn_error()
        _lib.check(_lib.lib.attn_mha_cache_size(
            ctypes.byref(s.config), s.B, s.Lq, s.Lk, ctypes.byref(n),
            ctypes.byref(err)), err)
        cache = torch.empty(n.value, dtype=torch.float32)
        out, weights = _mha_forward_c(s, q, k, v, pc, cache)
        ctx.s, ctx.cache = s, cache
        ctx.save_for_backward(q, k, v, *pc)
        if s.mode == _lib.ATTN_WEIGHTS_NONE:
            ctx.mark_non_differentiable(weights)
        return out, weights

    @staticmethod
    def backward(ctx, grad_out, grad_weights):
        if grad_weights is not None and bool(grad_weights.ne(0).any()):
            raise UnsupportedError(
                "attn.torch.MultiheadAttention: a gradient reached the returned "
                "attention weights, but attn's backward differentiates the "
                "output only. Use weights.detach() in the loss, or "
                "torch.nn.MultiheadAttention for gradients through the weights")
        s = ctx.s
        saved = ctx.saved_tensors
        q, k, v, pc = saved[0], saved[1], saved[2], saved[3:]
        need = ctx.needs_input_grad[1:]  # query, key, value, then params
        nparams = len(pc)
        if grad_out is None:
            return (None,) * (4 + nparams)
        g = grad_out.contiguous()
        if g.dtype != torch.float32:
            g = g.float()
        # d_query/d_key/d_value: one buffer per distinct input (self-attention
        # sums into one); None (NULL) where no gradient is wanted.
        nq = need[0] or (s.same_qk and need[1]) or (s.same_qv and need[2])
        dq = torch.zeros((s.B, s.Lq, s.E)) if nq else None
        if s.same_qk:
            dk = dq
        else:
            nk = need[1] or (s.same_kv and need[2])
            dk = torch.zeros((s.B, s.Lk, s.kdim)) if nk else None
        if s.same_qv:
            dv = dq
        elif s.same_kv:
            dv = dk
        else:
            dv = torch.zeros((s.B, s.Lk, s.vdim)) if need[2] else None
        gp = tuple(None if t is None else torch.zeros_like(t) for t in pc)
        gw = _weights_struct(s, gp)
        err = _lib.attn_error()
        st = _lib.lib.attn_mha_backward(
            ctypes.byref(s.config), ctypes.byref(_weights_struct(s, pc)),
            s.B, s.Lq, s.Lk, _fptr(q), _fptr(k), _fptr(v), ctypes.byref(s.p),
            _fptr(ctx.cache), _fptr(g),
            None if dq is None else _fptr(dq), None if dk is None else _fptr(dk),
            None if dv is None else _fptr(dv), ctypes.byref(gw), ctypes.byref(err))
        _lib.check(st, err)
        # a tensor passed in several slots gets its summed gradient once
        dk_out = None if s.same_qk else dk
        dv_out = None if (s.same_qv or s.same_kv) else dv
        grads = (dq if nq else None, dk_out, dv_out) + tuple(
            gt if n else None for gt, n in zip(gp, need[3:]))
        inputs = (q, k, v) + tuple(t for t in pc if t is not None)
        return (None,) + _maybe_refuse(grads, inputs)


@functools.lru_cache(maxsize=16)
def _tril(L):
    """bool [L, L], True on and below the diagonal (read only)."""
    return torch.ones(L, L, dtype=torch.bool).tril()


def _is_prefix(keep):
    """keep [B, Lk] bool: True when every row is True..True False..False."""
    lengths = keep.sum(-1)
    ar = torch.arange(keep.shape[-1])
    return bool(torch.equal(keep, ar[None, :] < lengths[:, None])), lengths


class MultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention over libattn's multi-head layer.

    Same constructor, parameters (in_proj_weight [3E, E], or q_proj_weight
    [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim] when kdim or
    vdim differ from E; in_proj_bias [3E]; out_proj.weight [E, E],
    out_proj.bias [E]), state_dict keys, initialisation (the same calls in
    the same order, so the same torch.manual_seed gives the same values) and
    forward conventions as PyTorch 1.13's module; load_state_dict works in
    both directions. batch_first=False by default, as in torch.

    forward(query, key, value, key_padding_mask=None, need_weights=True,
            attn_mask=None, average_attn_weights=True, is_causal=False)
      -> (out, weights or None)
    key_padding_mask [B, Lk] ([Lk] unbatched): bool/uint8 True = ignore
      that key, or floating (added).
    attn_mask [Lq, Lk] or [B*H, Lq, Lk] ([H, Lq, Lk] unbatched): bool/uint8
      True = NOT allowed, or floating (added).
    is_causal: add the causal mask (query i sees keys j <= i + Lk - Lq).
    A bool attn_mask equal to torch.triu(ones(L, L), 1) and a key padding
    mask whose rows are padded at the end run as libattn's causal mask and
    key lengths (whole tiles skipped); the result is the same.
    The returned weights are before dropout and carry no gradient (a loss
    that uses them raises at backward). A zero batch size or length gives
    PyTorch's result (empty, or out_proj.bias when Lk = 0).

    num_kv_heads (an addition; None: num_heads): grouped-query attention
    with H_kv key/value heads, H_kv dividing num_heads (1: multi-query).
    Key and value are projected to kv_dim = H_kv * head_dim: in_proj_weight
    is [E + 2 kv_dim, E] (k_proj_weight [kv_dim, kdim], v_proj_weight
    [kv_dim, vdim]), in_proj_bias [E + 2 kv_dim], and query head h attends
    with K/V head h // (num_heads // H_kv), PyTorch's repeat_interleave
    convention: the module equals torch.nn.MultiheadAttention whose k and v
    projection rows are those of the K/V heads repeated per group
    (repeat_interleave over heads). Initialised as torch initialises its
    module: Xavier-uniform over the [E + 2 kv_dim, E] in_proj_weight.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
                 batch_first=False, device=None, dtype=None, num_kv_heads=None):
        if add_bias_kv:
            raise UnsupportedError(
                "attn.torch.MultiheadAttention: add_bias_kv=True is not "
                "supported; use torch.nn.MultiheadAttention, or append the "
                "bias row to key and value yourself")
        if add_zero_attn:
            raise UnsupportedError(
                "attn.torch.MultiheadAttention: add_zero_attn=True is not "
                "supported; use torch.nn.MultiheadAttention, or append a zero "
                "row to key and value yourself")
        if device is not None and torch.device(device).type != "cpu":
            raise UnsupportedError(
                "attn.torch.MultiheadAttention: device %s; attn runs on the CPU "
                "only. Use torch.nn.MultiheadAttention there" % (device,))
        if dtype is not None and dtype != torch.float32:
            raise UnsupportedError(
                "attn.torch.MultiheadAttention: dtype %s; attn computes in "
                "float32 only. Use torch.nn.MultiheadAttention for %s"
                % (dtype, dtype))
        super().__init__()
        self.embed_dim = int(embed_dim)
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = (self.kdim == self.embed_dim
                                    and self.vdim == self.embed_dim)
        self.num_heads = int(num_heads)
        self.dropout = _check_dropout(dropout, "dropout")
        self.batch_first = bool(batch_first)
        if self.embed_dim <= 0 or self.num_heads <= 0 or self.kdim <= 0 or self.vdim <= 0:
            raise ValueError("attn.torch.MultiheadAttention: embed_dim (%d), "
                             "num_heads (%d), kdim and vdim must be > 0"
                             % (self.embed_dim, self.num_heads))
        self.head_dim = self.embed_dim // self.num_heads
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError("attn.torch.MultiheadAttention: embed_dim %d is not "
                             "divisible by num_heads %d"
                             % (self.embed_dim, self.num_heads))
        H = self.num_heads
        self.num_kv_heads = H if num_kv_heads is None else int(num_kv_heads)
        if not 1 <= self.num_kv_heads <= H or H % self.num_kv_heads:
            raise ValueError("attn.torch.MultiheadAttention: num_kv_heads %d must "
                             "divide num_heads %d (1..num_heads; None for "
                             "num_heads)" % (self.num_kv_heads, H))
        self.kv_dim = self.num_kv_heads * self.head_dim
        E, Ekv, f = self.embed_dim, self.kv_dim, dict(dtype=torch.float32)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = nn.Parameter(torch.empty((E, E), **f))
            self.k_proj_weight = nn.Parameter(torch.empty((Ekv, self.kdim), **f))
            self.v_proj_weight = nn.Parameter(torch.empty((Ekv, self.vdim), **f))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = nn.Parameter(torch.empty((E + 2 * Ekv, E), **f))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(E + 2 * Ekv, **f))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **f)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()
        cfg = _lib.attn_mha_config()
        cfg.embed_dim, cfg.num_heads = E, self.num_heads
        cfg.kdim, cfg.vdim, cfg.bias = self.kdim, self.vdim, 1 if bias else 0
        cfg.num_kv_heads = self.num_kv_heads
        self._config = cfg

    def _reset_parameters(self):
        """torch.nn.MultiheadAttention's: Xavier-uniform in-projection, zero
        biases (out_proj.weight keeps nn.Linear's init)."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)

    def extra_repr(self):
        gqa = ("" if self.num_kv_heads == self.num_heads
               else ", num_kv_heads=%d" % self.num_kv_heads)
        return ("embed_dim=%d, num_heads=%d, dropout=%g, kdim=%d, vdim=%d, "
                "batch_first=%s%s" % (self.embed_dim, self.num_heads, self.dropout,
                                      self.kdim, self.vdim, self.batch_first, gqa))

    def _expanded_proj(self):
        """The projections as torch.nn.MultiheadAttention's (use_separate_
        proj_weight form): q, k, v weights [E, *] and in_proj_bias [3E], the
        K/V heads' rows repeated over their groups (repeat_interleave), so
        that PyTorch's function computes this module's attention,
        differentiably."""
        E, Ekv, G = self.embed_dim, self.kv_dim, self.num_heads // self.num_kv_heads
        D = self.head_dim

        def rep(t):  # [Ekv, ...] -> [E, ...]: head g's rows for each of its G heads
            return t.reshape(self.num_kv_heads, D, *t.shape[1:]).repeat_interleave(
                G, dim=0).reshape(E, *t.shape[1:])

        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:E + Ekv], w[E + Ekv:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        if b is not None:
            b = torch.cat([b[:E], rep(b[E:E + Ekv]), rep(b[E + Ekv:])])
        return wq, rep(wk), rep(wv), b

    def _params(self):
        if self._qkv_same_embed_dim:
            p = (self.in_proj_weight, None, None)
        else:
            p = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        p += (self.in_proj_bias, self.out_proj.weight, self.out_proj.bias)
        names = ("in_proj_weight" if self._qkv_same_embed_dim else "q_proj_weight",
                 "k_proj_weight", "v_proj_weight", "in_proj_bias",
                 "out_proj.weight", "out_proj.bias")
        for t, n in zip(p, names):
            if t is not None:
                _check_tensor(t, "parameter " + n, alt=_TORCH_MHA)
        return p

    def _masks(self, s, key_padding_mask, attn_mask, is_causal, batched):
        """libattn's form of torch's masks: key lengths / causal where the
        masks have that exact shape, else bool (True = takes part) and
        additive masks broadcast to [B, H, Lq, Lk]."""
        B, H, Lq, Lk = s.B, s.H, s.Lq, s.Lk
        bools, floats = [], []
        key_lengths = None
        if key_padding_mask is not None:
            _check_tensor(key_padding_mask, "key_padding_mask", "mha_mask", _TORCH_MHA)
            want = (B, Lk) if batched else (Lk,)
            if tuple(key_padding_mask.shape) != want:
                raise ValueError("attn.torch: key_padding_mask must have shape %s, "
                                 "got %s" % (want, tuple(key_padding_mask.shape)))
            m = key_padding_mask.reshape(B, Lk)
            if m.dtype in (torch.bool, torch.uint8):
                keep = m == 0
                prefix, lengths = _is_prefix(keep)
                if prefix:
                    key_lengths = lengths.to(torch.int64).numpy().copy()
                else:
                    bools.append(keep.numpy().reshape(B, 1, 1, Lk))
            else:
                floats.append(m.detach().to(torch.float32).numpy().reshape(B, 1, 1, Lk).copy())
        causal = bool(is_causal)
        if attn_mask is not None:
            _check_tensor(attn_mask, "attn_mask", "mha_mask", _TORCH_MHA)
            shp = tuple(attn_mask.shape)
            if shp == (Lq, Lk):
                m = attn_mask.reshape(1, 1, Lq, Lk)
            elif shp == (B * H, Lq, Lk):
                m = attn_mask.reshape(B, H, Lq, Lk)
            else:
                raise ValueError(
                    "attn.torch: attn_mask must have shape %s or %s, got %s"
                    % ((Lq, Lk), ((B * H) if batched else H, Lq, Lk), shp))
            tril = _tril(Lq) if Lq == Lk and shp == (Lq, Lk) else None
            if m.dtype in (torch.bool, torch.uint8):
                keep = m == 0
                if tril is not None and torch.equal(keep[0, 0], tril):
                    causal = True
                else:
                    bools.append(keep.numpy())
            else:
                m = m.detach().to(torch.float32)
                # 0 on and below the diagonal, -inf above: the causal mask
                # (e.g. nn.Transformer.generate_square_subsequent_mask)
                if (tril is not None and torch.equal(torch.isneginf(m[0, 0]), ~tril)
                        and not m[0, 0][tril].any()):
                    causal = True
                else:
                    floats.append(m.numpy().copy())
        p = build_params(is_causal=causal, key_lengths=key_lengths,
                         dropout_p=self.dropout,
                         training=self.training and self.dropout > 0,
                         seed=_draw_seed() if self.training and self.dropout > 0 else 0,
                         num_threads=torch.get_num_threads())
        s.keep = [key_lengths]
        if bools:
            b = bools[0]
            for other in bools[1:]:
                b = b & other
            mb, mv = mask_view(mask_array(np.ascontiguousarray(b), "mask")[0], (B, H), Lq,
                               Lk, "mask")
            s.keep.append((mb, mv))
            p.bool_mask = ctypes.pointer(mv)
        if floats:
            f = floats[0]
            for other in floats[1:]:
                f = f + other
            mb, mv = mask_view(np.ascontiguousarray(f, dtype=np.float32), (B, H),
                               Lq, Lk, "mask")
            s.keep.append((mb, mv))
            p.add_mask = ctypes.pointer(mv)
        s.p = p

    def _zero_size(self, query, key, value, key_padding_mask, need_weights,
                   attn_mask, average_attn_weights, batched):
        """A zero batch size or length: no attention to compute (libattn takes
        sizes >= 1). torch's own function returns PyTorch's result (empty, or
        out_proj.bias when Lk = 0) with its zero gradients."""
        if batched and self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        sep = not self._qkv_same_embed_dim
        w_in, b_in = self.in_proj_weight, self.in_proj_bias
        wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self.num_kv_heads != self.num_heads:  # torch's function has no GQA
            sep = True
            wq, wk, wv, b_in = self._expanded_proj()
        out, w = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, w_in,
            b_in, None, None, False, 0.0, self.out_proj.weight,
            self.out_proj.bias, training=False, key_padding_mask=key_padding_mask,
            need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=sep, q_proj_weight=wq,
            k_proj_weight=wk, v_proj_weight=wv,
            average_attn_weights=average_attn_weights)
        if batched and self.batch_first:
            out = out.transpose(0, 1)
        return out, w

    def forward(self, query, key, value, key_padding_mask=None,
                need_weights=True, attn_mask=None, average_attn_weights=True,
                is_causal=False):
        """Returns (out, weights or None), like torch.nn.MultiheadAttention:
        out [B, Lq, E] (batch_first) or [Lq, B, E] ([Lq, E] unbatched);
        weights [B, Lq, Lk] averaged over heads, or [B, H, Lq, Lk] with
        average_attn_weights=False, None with need_weights=False."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            _check_tensor(t, name, alt=_TORCH_MHA)
        params = self._params()
        nd = query.dim()
        if nd not in (2, 3) or key.dim() != nd or value.dim() != nd:
            raise ValueError(
                "attn.torch: query, key and value must all be 3-D (batched) or "
                "all 2-D (unbatched), got shapes %s, %s, %s"
                % (tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        batched = nd == 3
        s = _MHACall()
        s.same_qk, s.same_kv, s.same_qv = key is query, value is key, value is query

        def layout(t):  # -> [B, L, D], a view
            if not batched:
                return t.unsqueeze(0)
            return t if self.batch_first else t.transpose(0, 1)

        q = layout(query)
        k = q if s.same_qk else layout(key)
        v = q if s.same_qv else (k if s.same_kv else layout(value))
        s.B, s.Lq, Eq = q.shape
        Bk, s.Lk, Dk = k.shape
        Bv, Lv, Dv = v.shape
        s.E, s.H, s.kdim, s.vdim = self.embed_dim, self.num_heads, self.kdim, self.vdim
        s.Ekv = self.kv_dim
        s.config = self._config
        if Eq != s.E or Dk != s.kdim or Dv != s.vdim:
            raise ValueError(
                "attn.torch: query, key and value must end in embed_dim=%d, "
                "kdim=%d, vdim=%d; got shapes %s, %s, %s"
                % (s.E, s.kdim, s.vdim, tuple(query.shape), tuple(key.shape),
                   tuple(value.shape)))
        if Bk != s.B or Bv != s.B or Lv != s.Lk:
            raise ValueError(
                "attn.torch: key and value must have query's batch size and the "
                "same length; got shapes %s, %s, %s"
                % (tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        if 0 in (s.B, s.Lq, s.Lk):
            return self._zero_size(query, key, value, key_padding_mask, need_weights,
                                   attn_mask, average_attn_weights, batched)
        self._masks(s, key_padding_mask, attn_mask, is_causal, batched)
        if not need_weights:
            s.mode = _lib.ATTN_WEIGHTS_NONE
        elif average_attn_weights:
            s.mode = _lib.ATTN_WEIGHTS_AVERAGE
        else:
            s.mode = _lib.ATTN_WEIGHTS_PER_HEAD

        tensors = (q, k, v) + tuple(t for t in params if t is not None)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            out, weights = _MHAFunction.apply(s, q, k, v, *params)
        else:  # inference: no activation cache
            pc = tuple(None if t is None else t.detach().contiguous() for t in params)
            qc = q.detach().contiguous()
            kc = qc if s.same_qk else k.detach().contiguous()
            vc = qc if s.same_qv else (kc if s.same_kv else v.detach().contiguous())
            out, weights = _mha_forward_c(s, qc, kc, vc, pc, None)

        if not batched:
            out = out[0]
            weights = weights[0] if need_weights else None
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, (weights if need_weights else None)

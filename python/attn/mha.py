"""attn.MultiheadAttention: torch.nn.MultiheadAttention's interface over libattn."""
import ctypes

import numpy as np

from . import _lib
from ._views import (c_array, check_real, int64_arg, mask_array, mask_view,
                     uint64_arg)
from .functional import build_params, per_head


def _to_numpy(x):
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _real_array(value, name, shape):
    """value as a numpy array of exactly shape holding real numbers (any
    strides, alignment or real dtype: the caller copies it into its own
    float32 buffer, converting)."""
    arr = _to_numpy(value)
    if arr.shape != shape:
        raise ValueError("%s must have shape %s, got %s" % (name, shape, arr.shape))
    check_real(arr, name, None)  # fp32 only: uint16 bf16 bits refused
    return arr


def _fixed_buffer(n):
    """n zero float32s the library may keep pointers into: a view, because
    an array that does not own its data cannot be resize()d (which would
    move the memory under those pointers)."""
    return np.zeros(n, dtype=np.float32)[:]


def _readonly(name, doc):
    def get(self):
        return self._dims[name]

    def set(self, value):
        raise AttributeError("MultiheadAttention.%s is fixed at construction "
                             "(the library's config and buffers are sized by "
                             "it); make a new module" % name)

    return property(get, set, doc=doc)


class _OutProj:
    """mha.out_proj.weight / .bias, like torch's out_proj Linear."""

    def __init__(self, owner):
        object.__setattr__(self, "_owner", owner)

    @property
    def weight(self):
        return self._owner.out_proj_weight

    @weight.setter
    def weight(self, v):
        self._owner.out_proj_weight = v

    @property
    def bias(self):
        return self._owner.out_proj_bias

    @bias.setter
    def bias(self, v):
        self._owner.out_proj_bias = v


def _param(name, doc):
    def get(self):
        return self._views[name]

    def set(self, value):
        view = self._views[name]
        if view is None:
            raise ValueError("this MultiheadAttention has no %s (%s)"
                             % (name, self._why_none(name)))
        view[...] = _real_array(value, name, view.shape)

    return property(get, set, doc=doc)


class IncrementalState:
    """The KV cache of one MultiheadAttention layer for incremental causal
    decoding (made by MultiheadAttention.incremental_state, used by
    MultiheadAttention.step): the keys and values of up to max_len positions
    for each of batch_size sequences, and the scratch a step needs, in one
    buffer this object owns (attn_mha_kv_bytes bytes; nothing is allocated
    per step).

    lengths: int64 array [batch_size], a view of the library's: how many
      positions each row holds. Assigning lengths[r] = 0 (or reset(r))
      starts row r over while the others keep theirs; lowering it rewinds.
    max_step: the most positions one step may append per row (1 for
      token-by-token decoding; a prompt may be fed in one step if it fits).
    threads: the most threads a step may use (the library's thread count
      when the state was made, unless given).
    nbytes: the block's size (attn_mha_kv_bytes); with grouped-query
      attention its keys and values, 2 * batch_size * max_len * kv_dim
      float32, are num_heads / num_kv_heads times fewer.
    """

    def __init__(self, module, batch_size, max_len, max_step=1, num_threads=0):
        self._config = module._config
        shape = _lib.attn_mha_kv_shape()
        shape.batch = int64_arg(batch_size, "batch_size")
        shape.max_len = int64_arg(max_len, "max_len")
        shape.max_step = int64_arg(max_step, "max_step")
        shape.threads = int(int64_arg(num_threads, "num_threads"))
        err = _lib.attn_error()
        n = ctypes.c_size_t()
        _lib.check(_lib.lib.attn_mha_kv_bytes(ctypes.byref(self._config),
                                              ctypes.byref(shape), ctypes.byref(n),
                                              ctypes.byref(err)), err)
        self._mem = np.zeros(n.value, dtype=np.uint8)[:]  # a view: never moved
        self._kv = _lib.attn_mha_kv()
        _lib.check(_lib.lib.attn_mha_kv_init(
            ctypes.byref(self._config), ctypes.byref(shape),
            self._mem.ctypes.data_as(ctypes.c_void_p), n.value,
            ctypes.byref(self._kv), ctypes.byref(err)), err)
        self.batch_size = int(shape.batch)
        self.max_len = int(shape.max_len)
        self.max_step = int(shape.max_step)
        self.threads = int(self._kv.threads)
        self.embed_dim = int(module.embed_dim)
        self.num_kv_heads = int(self._kv.num_kv_heads)
        # bytes of the one block (keys, values [batch_size, max_len, kv_dim]
        # each, and the step's scratch)
        self.nbytes = int(n.value)
        self.lengths = np.ctypeslib.as_array(self._kv.len, shape=(self.batch_size,))

    def reset(self, rows=None):
        """Empty every row (rows=None) or the given row(s)."""
        if rows is None:
            self.lengths[...] = 0
        else:
            self.lengths[rows] = 0

    def __repr__(self):
        return ("IncrementalState(batch_size=%d, max_len=%d, max_step=%d, lengths=%s)"
                % (self.batch_size, self.max_len, self.max_step, self.lengths.tolist()))


class MultiheadAttention:
    """Multi-head attention with torch.nn.MultiheadAttention's parameters,
    names and call conventions (batch_first defaults to True here).

    Grouped-query / multi-query attention: num_kv_heads = H_kv < num_heads
    (dividing it; None: num_heads) projects key and value to H_kv heads of
    head_dim, kv_dim = H_kv * head_dim wide, and query head h attends with
    K/V head h // (num_heads // H_kv) (PyTorch's repeat_interleave); 1 is
    multi-query attention. The key/value projections, their biases and the
    KV cache of incremental_state shrink to kv_dim.

    Parameters live in one packed float32 buffer (self.parameters_buffer) in
    the order w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o; in_proj_weight
    [E + 2 kv_dim, E] ([3E, E] without GQA) (or q_proj_weight [E, E],
    k_proj_weight [kv_dim, kdim], v_proj_weight [kv_dim, vdim] when kdim or
    vdim differ from E), in_proj_bias [E + 2 kv_dim], out_proj_weight
    [E, E] and out_proj_bias [E] are views into it. The
    buffer is allocated once and is what every forward and backward reads:
    assigning parameters_buffer or a named parameter copies the values into
    it (exact shape and a real dtype required, converted to float32; any
    strides or alignment), so views taken earlier stay live. embed_dim,
    num_heads, kdim, vdim, head_dim and bias are read-only. Initialised by
    attn_mha_init from seed, as PyTorch initialises its module.

    Training: forward() followed by backward(grad_out) gives the gradients
    w.r.t. the inputs (returned) and the parameters (self.grads, a dict of
    arrays under the parameter names above; self.grads_buffer is the packed
    buffer in parameters_buffer's layout, so `parameters_buffer -= lr *
    grads_buffer` is an SGD step). Each backward() returns fresh gradients
    unless called with accumulate=True (then they add into the previous
    ones, like PyTorch's .grad); zero_grad() drops them. Assigning
    grads_buffer (None drops the gradients) copies into the module's own
    buffer like parameters_buffer. While
    requires_grad is True (the default, in train and eval mode alike) every
    forward keeps what its backward needs until the next forward: the
    activation cache (attn_mha_cache_size floats, B*(2*Lq*E +
    2*Lk*kv_dim + H*Lq)), float32 copies of query/key/value, the masks, and a copy of the
    parameters (so changing them between forward and backward does not
    change the gradients of the forward that ran). Set requires_grad =
    False (or requires_grad_(False)) for inference without that memory;
    release_saved() frees it at any time.

    Dropout: in training mode with dropout > 0 each forward draws its mask
    from (seed, offset) and then advances the offset; backward() reuses the
    exact mask of the forward it differentiates. seed is an integer in
    [0, 2^64); dropout in [0, 1) (both checked on assignment too).

    Zero-size inputs give PyTorch's results: B = 0 or Lq = 0 an empty
    output (and zero gradients for key and value and the parameters); Lk = 0
    attention output 0 for every query (out = out_proj_bias), weights
    [..., Lq, 0], gradient only into out_proj_bias. embed_dim, num_heads,
    kdim and vdim must be >= 1.
    """

    embed_dim = _readonly("embed_dim", "E")
    num_heads = _readonly("num_heads", "H")
    num_kv_heads = _readonly("num_kv_heads", "H_kv: key/value heads (num_heads unless given)")
    kv_dim = _readonly("kv_dim", "num_kv_heads * head_dim: width of the key/value projections")
    kdim = _readonly("kdim", "width of key (embed_dim unless given)")
    vdim = _readonly("vdim", "width of value (embed_dim unless given)")
    head_dim = _readonly("head_dim", "E // H")
    bias = _readonly("bias", "whether the projections have biases")
    _qkv_same_embed_dim = _readonly("_qkv_same_embed_dim", "kdim == vdim == E")

    in_proj_weight = _param("in_proj_weight",
                            "[E + 2 kv_dim, E] (None if kdim/vdim != E)")
    q_proj_weight = _param("q_proj_weight", "[E, E] (None if kdim == vdim == E)")
    k_proj_weight = _param("k_proj_weight", "[kv_dim, kdim] (None if kdim == vdim == E)")
    v_proj_weight = _param("v_proj_weight", "[kv_dim, vdim] (None if kdim == vdim == E)")
    in_proj_bias = _param("in_proj_bias", "[E + 2 kv_dim] (None without bias)")
    out_proj_weight = _param("out_proj_weight", "[E, E]")
    out_proj_bias = _param("out_proj_bias", "[E] (None without bias)")

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, kdim=None,
                 vdim=None, batch_first=True, seed=0, num_kv_heads=None):
        E = int64_arg(embed_dim, "embed_dim")
        H = int64_arg(num_heads, "num_heads")
        Hkv = H if num_kv_heads is None else int64_arg(num_kv_heads, "num_kv_heads")
        if H > 0 and (not 1 <= Hkv <= H or H % Hkv):
            # the library's check, said in Python's terms (it reads 0 as
            # "num_heads", which None says here)
            raise _lib.AttnError(
                _lib.ATTN_ERR_SHAPE, "num_kv_heads %d: must divide num_heads %d "
                "(1..num_heads; None for num_heads)" % (Hkv, H))
        given = [None if d is None else int64_arg(d, n)
                 for d, n in ((kdim, "kdim"), (vdim, "vdim"))]
        if any(d is not None and d <= 0 for d in given):
            # the library would read 0 as "embed_dim" (and a key of width 0
            # as one of width E): refuse it, in the library's words
            raise _lib.AttnError(
                _lib.ATTN_ERR_SHAPE, "kdim (%s) and vdim (%s) must be > 0 "
                "(None: embed_dim)" % tuple(given))
        kd, vd = (E if d is None else d for d in given)
        self._dims = {"embed_dim": E, "num_heads": H, "kdim": kd, "vdim": vd,
                      "bias": bool(bias), "num_kv_heads": Hkv,
                      "head_dim": E // H if H > 0 else 0,
                      "kv_dim": Hkv * (E // H) if H > 0 else 0,
                      "_qkv_same_embed_dim": kd == E and vd == E}
        self.dropout = dropout
        self.batch_first = bool(batch_first)
        self.seed = seed
        self.training = True
        self.requires_grad = True
        self._offset = 0
        self._saved = None       # what backward() needs from the last forward
        self._grads = None       # name -> gradient, after backward()
        self._gbuf = None        # the packed gradients _grads views into

        c = _lib.attn_mha_config()
        c.embed_dim = E
        c.num_heads = H
        c.kdim = kd
        c.vdim = vd
        c.bias = 1 if self.bias else 0
        c.num_kv_heads = Hkv
        self._config = c

        err = _lib.attn_error()
        count = ctypes.c_size_t()
        _lib.check(_lib.lib.attn_mha_param_count(ctypes.byref(c),
                                                 ctypes.byref(count),
                                                 ctypes.byref(err)), err)
        # the one parameter buffer: _weights points into it for good
        self._params = _fixed_buffer(count.value)
        w = self._weights_in(self._params)
        self._weights = w
        self._views = self._make_views(w)
        _lib.check(_lib.lib.attn_mha_init(ctypes.byref(c), ctypes.byref(w),
                                          self.seed, ctypes.byref(err)), err)
        self.out_proj = _OutProj(self)

    # ------------------------------------------------------------ parameters

    @property
    def parameters_buffer(self):
        """The packed float32 parameters [attn_mha_param_count] (the layout
        of attn_mha_weights_from_buffer); the named parameters view it."""
        return self._params

    @parameters_buffer.setter
    def parameters_buffer(self, value):
        if value is self._params:  # `buf -= lr * g` assigns the same array
            return
        self._params[...] = _real_array(value, "parameters_buffer",
                                        self._params.shape)

    @property
    def grads_buffer(self):
        """The packed gradients of the last backward() (parameters_buffer's
        layout), or None."""
        return self._gbuf

    @grads_buffer.setter
    def grads_buffer(self, value):
        if value is None:
            self.zero_grad()
            return
        if value is self._gbuf:
            return
        arr = _real_array(value, "grads_buffer", self._params.shape)
        if self._gbuf is None:
            self._new_grads(_fixed_buffer(self._params.size))
        self._gbuf[...] = arr

    @property
    def grads(self):
        """parameter name -> gradient (views into grads_buffer), or None."""
        return self._grads

    @property
    def dropout(self):
        return self._dropout

    @dropout.setter
    def dropout(self, value):
        p = float(value)
        if not 0.0 <= p < 1.0:  # libattn takes dropout_p in [0, 1)
            raise ValueError("dropout must be in [0, 1), got %r" % (value,))
        self._dropout = p

    @property
    def seed(self):
        return self._seed

    @seed.setter
    def seed(self, value):
        self._seed = uint64_arg(value, "seed")

    def _new_grads(self, gbuf):
        """Make gbuf (parameter_count float32) the gradient buffer."""
        views = self._make_views(self._weights_in(gbuf), gbuf)
        self._grads = {n: a for n, a in views.items() if a is not None}
        self._gbuf = gbuf

    @staticmethod
    def _offset_of(buf, ptr, n):
        """Element offset of ptr inside buf (checks the library kept the n
        floats in bounds)."""
        base = buf.ctypes.data
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        off, rem = divmod(addr - base, 4)
        if rem or off < 0 or off + n > buf.size:
            raise RuntimeError("attn_mha_weights_from_buffer returned a pointer "
                               "outside the buffer")
        return off

    def _weights_in(self, buf):
        """attn_mha_weights pointing into buf (parameter_count floats)."""
        w = _lib.attn_mha_weights()
        err = _lib.attn_error()
        _lib.check(_lib.lib.attn_mha_weights_from_buffer(
            ctypes.byref(self._config), _lib.float_ptr(buf), ctypes.byref(w),
            ctypes.byref(err)), err)
        return w

    def _make_views(self, w, buf=None):
        """Torch-named views into buf (default: the parameters) given the
        pointers w that attn_mha_weights_from_buffer returned for it."""
        E, kd, vd, Ekv = self.embed_dim, self.kdim, self.vdim, self.kv_dim
        if buf is None:
            buf = self.parameters_buffer
        offset_of = lambda ptr, n: self._offset_of(buf, ptr, n)  # noqa: E731

        def view(ptr, shape):
            n = int(np.prod(shape))
            off = offset_of(ptr, n)
            return buf[off:off + n].reshape(shape)

        wq = view(w.w_q, (E, E))
        wk = view(w.w_k, (Ekv, kd))
        wv = view(w.w_v, (Ekv, vd))
        views = {"q_proj_weight": None, "k_proj_weight": None,
                 "v_proj_weight": None, "in_proj_weight": None,
                 "in_proj_bias": None, "out_proj_bias": None}
        if self._qkv_same_embed_dim:
            rows = E + 2 * Ekv  # the stacked in-projection's
            off = offset_of(w.w_q, rows * E)
            if (offset_of(w.w_k, Ekv * E) != off + E * E
                    or offset_of(w.w_v, Ekv * E) != off + (E + Ekv) * E):
                raise RuntimeError("w_q, w_k, w_v are not stacked in the buffer")
            views["in_proj_weight"] = buf[off:off + rows * E].reshape(rows, E)
        else:
            views["q_proj_weight"] = wq
            views["k_proj_weight"] = wk
            views["v_proj_weight"] = wv
        views["out_proj_weight"] = view(w.w_o, (E, E))
        if self.bias:
            off = offset_of(w.b_q, E + 2 * Ekv)
            if (offset_of(w.b_k, Ekv) != off + E
                    or offset_of(w.b_v, Ekv) != off + E + Ekv):
                raise RuntimeError("b_q, b_k, b_v are not stacked in the buffer")
            views["in_proj_bias"] = buf[off:off + E + 2 * Ekv]
            views["out_proj_bias"] = view(w.b_o, (E,))
        return views

    def _why_none(self, name):
        if name.endswith("bias"):
            return "bias=False"
        if name == "in_proj_weight":
            return "kdim/vdim differ from embed_dim; use q/k/v_proj_weight"
        return "kdim == vdim == embed_dim; use in_proj_weight"

    def state_dict(self):
        """Copies of the parameters under torch.nn.MultiheadAttention's
        state_dict names (load into torch with torch.from_numpy)."""
        names = ["in_proj_weight", "q_proj_weight", "k_proj_weight",
                 "v_proj_weight", "in_proj_bias"]
        d = {n: self._views[n].copy() for n in names if self._views[n] is not None}
        d["out_proj.weight"] = self.out_proj_weight.copy()
        if self.bias:
            d["out_proj.bias"] = self.out_proj_bias.copy()
        return d

    def load_state_dict(self, state):
        """Copy parameters from a dict with torch's names (numpy arrays or
        torch tensors). Every parameter this module has must be present."""
        want = {"out_proj.weight": "out_proj_weight",
                "out_proj.bias": "out_proj_bias"}
        for n in ["in_proj_weight", "q_proj_weight", "k_proj_weight",
                  "v_proj_weight", "in_proj_bias"]:
            want[n] = n
        needed = [k for k, a in want.items() if self._views[a] is not None]
        missing = [k for k in needed if k not in state]
        unexpected = [k for k in state if k not in needed
                      and k not in ("bias_k", "bias_v")]
        if missing or unexpected:
            raise ValueError("load_state_dict: missing %s, unexpected %s"
                             % (missing, unexpected))
        for k in needed:
            setattr(self, want[k], state[k])

    def requires_grad_(self, requires_grad=True):
        """Whether forward() keeps what backward() needs (see the class
        docstring). Returns self."""
        self.requires_grad = bool(requires_grad)
        if not self.requires_grad:
            self._saved = None
        return self

    def release_saved(self):
        """Drop the last forward's saved activations (backward() then raises
        until the next forward)."""
        self._saved = None

    def zero_grad(self):
        """Drop the gradients (self.grads = self.grads_buffer = None)."""
        self._grads = None
        self._gbuf = None

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def __repr__(self):
        return ("MultiheadAttention(embed_dim=%d, num_heads=%d, dropout=%g, "
                "bias=%s, kdim=%d, vdim=%d, batch_first=%s%s)"
                % (self.embed_dim, self.num_heads, self.dropout, self.bias,
                   self.kdim, self.vdim, self.batch_first,
                   "" if self.num_kv_heads == self.num_heads
                   else ", num_kv_heads=%d" % self.num_kv_heads))

    # ------------------------------------------------------------ forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, query, key, value, key_padding_mask=None,
                need_weights=True, attn_mask=None, average_attn_weights=True,
                is_causal=False, softcap=None, alibi_slopes=None, sinks=None):
        """Returns (out, weights or None) like torch.nn.MultiheadAttention.

        query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim] when
        batch_first, else [L, B, *]; unbatched [L, *] also works.
        key_padding_mask [B, Lk] (or [Lk] unbatched): bool True = ignore that
          key; float: added.
        attn_mask [Lq, Lk] or [B*H, Lq, Lk] ([H, Lq, Lk] unbatched): bool
          True = NOT allowed (the opposite of scaled_dot_product_attention);
          float: added.
        is_causal: apply the causal mask (query i sees keys j <= i + Lk - Lq),
          with or without attn_mask.
        softcap, alibi_slopes, sinks: the attention variants, as for
          attn.scaled_dot_product_attention: softcap c > 0 turns each scaled
          score s into c * tanh(s / c), before alibi_slopes and the masks;
          alibi_slopes (num_heads values m_h) adds -m_h * |i + Lk - Lq - j|;
          sinks (num_heads logits) join each head's softmax denominators
          (the weights returned then sum to less than 1 over the keys), and
          backward() returns their gradient too. Per query head, with or
          without num_kv_heads.
        weights: [B, Lq, Lk] averaged over heads, or [B, H, Lq, Lk] when
          average_attn_weights=False; None when need_weights=False.
        """
        E, H = self.embed_dim, self.num_heads
        qa, ka, va = _to_numpy(query), _to_numpy(key), _to_numpy(value)
        batched = qa.ndim == 3
        if qa.ndim not in (2, 3):
            raise ValueError("query must be 2-D (unbatched) or 3-D (batched), "
                             "got shape %s" % (qa.shape,))
        if ka.ndim != qa.ndim or va.ndim != qa.ndim:
            raise ValueError(
                "query, key and value must all be %s: got shapes %s, %s, %s"
                % ("3-D (batched)" if batched else "2-D (unbatched)",
                   qa.shape, ka.shape, va.shape))
        for a, name in ((qa, "query"), (ka, "key"), (va, "value")):
            check_real(a, name, None)

        same_qk, same_kv = key is query, value is key
        same_qv = value is query

        self._saved = None  # a forward always replaces the saved state
        keep_for_backward = self.requires_grad

        def prep(a):  # -> contiguous float32 [B, L, D]
            if not batched:
                a = a[None]
            elif not self.batch_first:
                a = a.transpose(1, 0, 2)
            if keep_for_backward:  # a copy the caller cannot modify
                return np.array(a, dtype=np.float32, order="C", copy=True)
            return c_array(a)  # (aligned: a copy when the caller's is not)

        q = prep(qa)
        k = q if same_qk else prep(ka)
        v = q if same_qv else (k if same_kv else prep(va))
        B, Lq, Eq = q.shape
        Bk, Lk, Dk = k.shape
        Bv, Lv, Dv = v.shape
        if Eq != E:
            raise ValueError("query's last dim must be embed_dim=%d, got shape %s"
                             % (E, qa.shape))
        if Dk != self.kdim:
            raise ValueError("key's last dim must be kdim=%d, got shape %s"
                             % (self.kdim, ka.shape))
        if Dv != self.vdim:
            raise ValueError("value's last dim must be vdim=%d, got shape %s"
                             % (self.vdim, va.shape))
        if Bk != B or Bv != B:
            raise ValueError("query, key and value must have the same batch size: "
                             "got shapes %s, %s, %s" % (qa.shape, ka.shape, va.shape))
        if Lv != Lk:
            raise ValueError("key and value must have the same length: got "
                             "shapes %s, %s" % (ka.shape, va.shape))

        bools, floats = [], []  # 4-D arrays broadcastable to [B, H, Lq, Lk]
        key_lengths = None
        if key_padding_mask is not None:
            m, is_bool = mask_array(_to_numpy(key_padding_mask), "key_padding_mask")
            want = (B, Lk) if batched else (Lk,)
            if m.shape != want:
                raise ValueError("key_padding_mask must have shape %s, got %s"
                                 % (want, m.shape))
            m = m.reshape(B, 1, 1, Lk)
            if is_bool:
                allowed = m == 0
                lengths = allowed.sum(axis=-1).reshape(B)
                if np.array_equal(allowed.reshape(B, Lk),
                                  np.arange(Lk)[None, :] < lengths[:, None]):
                    key_lengths = np.ascontiguousarray(lengths, dtype=np.int64)
                else:
                    bools.append(allowed.view(np.uint8))
            else:
                floats.append(m)
        if attn_mask is not None:
            m, is_bool = mask_array(_to_numpy(attn_mask), "attn_mask")
            if m.shape == (Lq, Lk):
                m = m.reshape(1, 1, Lq, Lk)
            elif m.shape == (B * H, Lq, Lk):
                m = m.reshape(B, H, Lq, Lk)
            else:
                raise ValueError(
                    "attn_mask must have shape %s or %s, got %s"
                    % ((Lq, Lk), ((B * H) if batched else H, Lq, Lk), m.shape))
            if is_bool:
                bools.append((m == 0).view(np.uint8))
            else:
                floats.append(m)

        Lk_real = Lk
        empty = B == 0 or Lq == 0  # no output element: the library is not run
        if Lk == 0 and not empty:
            # one stand-in key that key_lengths 0 hides: every query sees no
            # key, so the attention output is 0 (PyTorch's result for Lk = 0)
            # and the library computes the rest (out = out_proj_bias, its
            # gradients); the masks over no key are dropped
            Lk = 1
            k = np.zeros((B, Lk, self.kdim), np.float32)
            v = k if same_kv else np.zeros((B, Lk, self.vdim), np.float32)
            key_lengths = np.zeros(B, np.int64)
            bools, floats = [], []
        # [H] float32 each (None: off); kept alive with p (it points at them)
        slopes = None if alibi_slopes is None else per_head(
            _to_numpy(alibi_slopes), "alibi_slopes", H, H)
        sink = None if sinks is None else per_head(_to_numpy(sinks), "sinks", H, H)
        p = build_params(
            is_causal=is_causal, key_lengths=key_lengths,
            dropout_p=self.dropout, training=self.training and self.dropout > 0,
            seed=self.seed, offset=self._offset, softcap=softcap,
            alibi_slopes=slopes, sinks=sink)
        keep = [slopes, sink]
        if bools:
            b = bools[0]
            for other in bools[1:]:
                b = (b & other)
            mb, mv = mask_view(np.asarray(b, dtype=np.uint8), (B, H), Lq, Lk,
                               "mask")
            keep.append((mb, mv))
            p.bool_mask = ctypes.pointer(mv)
        if floats:
            f = floats[0]
            for other in floats[1:]:
                f = f + other
            mb, mv = mask_view(np.asarray(f, dtype=np.float32), (B, H), Lq, Lk,
                               "mask")
            keep.append((mb, mv))
            p.add_mask = ctypes.pointer(mv)

        out = np.empty((B, Lq, E), dtype=np.float32)
        if not need_weights:
            mode, weights = _lib.ATTN_WEIGHTS_NONE, None
        elif average_attn_weights:
            mode = _lib.ATTN_WEIGHTS_AVERAGE
            weights = np.empty((B, Lq, Lk), dtype=np.float32)
        else:
            mode = _lib.ATTN_WEIGHTS_PER_HEAD
            weights = np.empty((B, H, Lq, Lk), dtype=np.float32)

        err = _lib.attn_error()
        cache = params = None
        wstruct = self._weights
        if keep_for_backward and not empty:
            n = ctypes.c_size_t()
            _lib.check(_lib.lib.attn_mha_cache_size(
                ctypes.byref(self._config), B, Lq, Lk, ctypes.byref(n),
                ctypes.byref(err)), err)
            cache = np.empty(n.value, dtype=np.float32)
            params = self._params.copy()
            wstruct = self._weights_in(params)
        if empty:
            out[...] = 0
            if weights is not None:
                weights[...] = 0
        else:
            st = _lib.lib.attn_mha_forward(
                ctypes.byref(self._config), ctypes.byref(wstruct), B, Lq, Lk,
                _lib.float_ptr(q), _lib.float_ptr(k), _lib.float_ptr(v),
                ctypes.byref(p), _lib.float_ptr(out), mode,
                _lib.float_ptr(weights), _lib.float_ptr(cache),
                ctypes.byref(err))
            _lib.check(st, err)
        if Lk != Lk_real and weights is not None:
            weights = np.zeros(weights.shape[:-1] + (Lk_real,), np.float32)
        if p.training and p.dropout_p > 0:
            self._offset += 1
        if keep_for_backward:
            self._saved = dict(
                B=B, Lq=Lq, Lk=Lk, Lk_real=Lk_real, empty=empty,
                q=q, k=k, v=v, p=p, keep=keep, sinks=sink is not None,
                key_lengths=key_lengths, cache=cache, params=params,
                weights=wstruct, batched=batched, batch_first=self.batch_first,
                same_qk=same_qk, same_kv=same_kv, same_qv=same_qv,
                out_shape=((Lq, E) if not batched else
                           (B, Lq, E) if self.batch_first else (Lq, B, E)))
        del keep

        if not batched:
            out = out[0]
            if weights is not None:
                weights = weights[0]
        elif not self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
        return out, weights

    # ------------------------------------------------------------ decoding

    def incremental_state(self, batch_size, max_len, max_step=1, num_threads=0):
        """A KV cache for step() (see IncrementalState): batch_size rows of up
        to max_len positions, at most max_step new positions per step. For
        self-attention (kdim == vdim == embed_dim)."""
        return IncrementalState(self, batch_size, max_len, max_step, num_threads)

    def step(self, x, state):
        """Incremental causal self-attention: x holds the inputs at each
        row's next T positions (rows 0..n-1 of state, row r at positions
        state.lengths[r] .. + T - 1; rows may be at different positions);
        returns the layer's output there, what forward(x_all, x_all, x_all,
        is_causal=True) gives at those positions for each row's whole
        prefix x_all (up to float32 rounding). Appends the positions' keys and values to
        state (lengths += T).

        x: [n, T, E] when batch_first, else [T, n, E]; unbatched [T, E]
        (row 0). T <= state.max_step, n <= state.batch_size. Inference
        only: no masks, no dropout (raises in training mode with dropout > 0;
        call eval()), no gradient. Raises AttnStateError (a RuntimeError)
        when a row's cache is full, AttnError (ValueError) on shapes."""
        if not isinstance(state, IncrementalState):
            raise TypeError("state must be an IncrementalState "
                            "(MultiheadAttention.incremental_state), got %s"
                            % type(state).__name__)
        if self.training and self.dropout > 0:
            raise ValueError("step() takes no dropout: call eval() first "
                             "(dropout=%g, training mode)" % self.dropout)
        E = self.embed_dim
        xa = _to_numpy(x)
        check_real(xa, "x", None)
        if xa.ndim not in (2, 3) or xa.shape[-1] != E:
            raise ValueError("x must be [n, T, %d] (batch_first), [T, n, %d] or "
                             "unbatched [T, %d], got shape %s" % (E, E, E, xa.shape))
        batched = xa.ndim == 3
        a = xa if batched else xa[None]
        if batched and not self.batch_first:
            a = a.transpose(1, 0, 2)
        a = c_array(a)
        n, T = a.shape[0], a.shape[1]
        out = np.empty((n, T, E), dtype=np.float32)
        if n and T:
            p = build_params()
            err = _lib.attn_error()
            st = _lib.lib.attn_mha_step(
                ctypes.byref(self._config), ctypes.byref(self._weights),
                ctypes.byref(state._kv), n, T, _lib.float_ptr(a), ctypes.byref(p),
                _lib.float_ptr(out), ctypes.byref(err))
            _lib.check(st, err)
        if not batched:
            return out[0]
        if not self.batch_first:
            return np.ascontiguousarray(out.transpose(1, 0, 2))
        return out

    # ------------------------------------------------------------ backward

    def backward(self, grad_out, accumulate=False):
        """Gradients of the last forward() given grad_out (the gradient of
        the loss w.r.t. its output, the output's shape and layout).

        Returns (d_query, d_key, d_value) float32 in the inputs' shapes and
        layout (batch_first or not, unbatched or not), and, when the forward
        took sinks, d_sinks float32 [num_heads] as a fourth entry (the
        layout of attn.scaled_dot_product_attention_grad); sets self.grads
        (parameter name -> gradient array, e.g. in_proj_weight, in_proj_bias,
        out_proj_weight, out_proj_bias; q/k/v_proj_weight when kdim/vdim
        differ from embed_dim) and self.grads_buffer (packed, the layout of
        parameters_buffer). The attention weights output has no gradient.

        When the forward got the same object for several of query, key and
        value (self-attention), the gradient w.r.t. that object is the sum
        of its contributions (what PyTorch leaves in x.grad): the matching
        entries of the returned tuple are then one and the same array
        holding that sum.

        accumulate=False: fresh gradients (the previous self.grads are
        replaced). accumulate=True: added into the existing self.grads_buffer
        (new ones when there are none), like PyTorch's .grad. backward() may
        be called more than once for the same forward. Raises AttnStateError
        (a RuntimeError) when there is no forward to differentiate.
        """
        sv = self._saved
        if sv is None:
            raise _lib.AttnStateError(
                "MultiheadAttention.backward() needs a preceding forward() "
                "that kept its activations: call the module first, with "
                "requires_grad=True (the default); a forward with "
                "requires_grad=False or release_saved() drops them")
        E = self.embed_dim
        B, Lq, Lk = sv["B"], sv["Lq"], sv["Lk"]
        g = _to_numpy(grad_out)
        check_real(g, "grad_out", None)
        if g.shape != sv["out_shape"]:
            raise ValueError("grad_out must have the shape of the output %s, "
                             "got %s" % (sv["out_shape"], g.shape))
        batched, batch_first = sv["batched"], sv["batch_first"]
        if not batched:
            g = g[None]
        elif not batch_first:
            g = g.transpose(1, 0, 2)
        g = c_array(g)

        dq = np.zeros((B, Lq, E), dtype=np.float32)
        dk = dq if sv["same_qk"] else np.zeros((B, Lk, self.kdim), np.float32)
        if sv["same_qv"]:
            dv = dq
        elif sv["same_kv"]:
            dv = dk
        else:
            dv = np.zeros((B, Lk, self.vdim), dtype=np.float32)

        if accumulate and self._gbuf is not None:
            gbuf = self._gbuf  # the module's own, parameter_count floats
        else:
            gbuf = _fixed_buffer(self._params.size)
        gw = self._weights_in(gbuf)

        dsinks = None
        if sv["sinks"]:  # the library ADDS dL/dsinks [H] into it
            dsinks = np.zeros(self.num_heads, np.float32)
            sv["p"].d_sinks = dsinks.ctypes.data_as(_lib.c_float_p)
        if not sv["empty"]:  # (an empty output: every gradient is 0)
            err = _lib.attn_error()
            st = _lib.lib.attn_mha_backward(
                ctypes.byref(self._config), ctypes.byref(sv["weights"]), B, Lq,
                Lk, _lib.float_ptr(sv["q"]), _lib.float_ptr(sv["k"]),
                _lib.float_ptr(sv["v"]), ctypes.byref(sv["p"]),
                _lib.float_ptr(sv["cache"]), _lib.float_ptr(g),
                _lib.float_ptr(dq), _lib.float_ptr(dk), _lib.float_ptr(dv),
                ctypes.byref(gw), ctypes.byref(err))
            _lib.check(st, err)

        if gbuf is not self._gbuf:
            self._new_grads(gbuf)
        if Lk != sv["Lk_real"]:  # the stand-in key's gradients: no key's
            dk = dk[:, :0]
            dv = dk if sv["same_kv"] else dv[:, :0]

        done = {}

        def back(a):  # [B, L, D] -> the caller's layout, once per buffer
            if id(a) not in done:
                if not batched:
                    r = a[0]
                elif not batch_first:
                    r = np.ascontiguousarray(a.transpose(1, 0, 2))
                else:
                    r = a
                done[id(a)] = r
            return done[id(a)]

        sv["p"].d_sinks = None  # dsinks is the caller's now
        grads = back(dq), back(dk), back(dv)
        return grads if dsinks is None else grads + (dsinks,)

"""numpy arrays -> attn_tensor / attn_mask views, copying only when needed."""
import ctypes
import operator

import numpy as np

from . import _lib

_F32 = np.dtype(np.float32)
_U16 = np.dtype(np.uint16)


def _prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


def merge_dims(shape, strides):
    """(size, stride) of dims that can be read as one flat dim, else None.

    shape/strides are outer-to-inner, strides in elements. Size-1 dims are
    ignored; an empty or all-size-1 list merges to (1, 0).
    """
    dims = [(int(n), int(s)) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return _prod(shape), 0
    size, stride = dims[-1]
    for n, s in reversed(dims[:-1]):
        if n == 0 or size == 0:
            return _prod(shape), 0
        if s != stride * size:
            return None
        size *= n
    return size, stride


def _elem_strides(a):
    """Element strides of a, or None when a byte stride is not a whole,
    non-negative number of elements or the data is misaligned."""
    isz = a.itemsize
    if not a.flags.aligned:
        return None
    out = []
    for s, n in zip(a.strides, a.shape):
        if n == 1:
            out.append(0)
            continue
        if s < 0 or s % isz:
            return None
        out.append(s // isz)
    return out


def _to_4d(a):
    """Leading dims of a (..., L, D) array as (B, H) with strides, or None.

    No leading dims: B = H = 1. One: B = n, H = 1. Two or more: B = the
    first, H = the product of the rest (needs them mergeable).
    """
    st = _elem_strides(a)
    if st is None:
        return None
    lead, lst = a.shape[:-2], st[:-2]
    if len(lead) == 0:
        B, sB, H, sH = 1, 0, 1, 0
    else:
        B, sB = int(lead[0]), lst[0]
        m = merge_dims(lead[1:], lst[1:])
        if m is None:
            return None
        H, sH = m
    return (B, H, int(a.shape[-2]), int(a.shape[-1])), (sB, sH, st[-2], st[-1])


def _natural(dims, strides):
    """Give size-1 dims the stride a contiguous array would have (harmless
    for the library, and friendlier to any overlap check)."""
    out = list(strides)
    acc = 1
    for i in range(3, -1, -1):
        if dims[i] == 1:
            out[i] = acc
        acc *= max(int(dims[i]), 1)
    return out


def as_numpy(x):
    """numpy view of x; torch tensors (even with requires_grad) detached."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def check_real(a, name, bf16_hint="dtype='bf16'"):
    """Refuse a numpy array that does not hold real numbers, and uint16:
    numpy has no bfloat16, so bfloat16 bit patterns come as uint16, and
    read as integers they would give values like 48,896 (-0.5) without a word.
    uint16 is taken only where bf16 is asked for (bf16_hint names how; None:
    this argument never takes bf16)."""
    if a.dtype.kind not in "fiu":
        raise ValueError("%s must hold real numbers, got dtype %s" % (name, a.dtype))
    if a.dtype == _U16:
        how = ("pass %s to read them as bfloat16, or " % bf16_hint) if bf16_hint else ""
        raise ValueError(
            "%s is a uint16 array: bfloat16 bit patterns are read only as bf16 "
            "(%sconvert them with attn.float32_from_bf16); integer values: "
            "convert with .astype(numpy.float32)" % (name, how))


def as_float_array(x, name, min_ndim=2, bf16_hint="dtype='bf16'"):
    a = as_numpy(x)
    check_real(a, name, bf16_hint)
    if a.ndim < min_ndim:
        raise ValueError("%s must have shape (..., L, E) with at least %d dims, "
                         "got shape %s" % (name, min_ndim, a.shape))
    return a


def c_array(a, dtype=_F32):
    """a as a C-contiguous, aligned, native-order array of dtype: a itself
    when it already is one, else a copy (np.ascontiguousarray alone keeps a
    misaligned buffer, e.g. np.frombuffer(..., offset=1), misaligned)."""
    return np.require(np.asarray(a), dtype, ("C", "A"))


def tensor_view(x, name, bf16=False, bf16_hint="dtype='bf16'"):
    """(array kept alive, attn_tensor) for a (..., L, D) input; the array is
    x itself when x is float32 with usable strides (aligned, whole-element,
    non-negative), else an aligned contiguous copy. bf16=True: x must hold
    bfloat16 bits as uint16 (see bf16_array), read the same way."""
    if bf16:
        a = bf16_array(x, name)
        got = _to_4d(a)
        if got is None:
            a = c_array(a, _U16)
            got = _to_4d(a)
    else:
        a = as_float_array(x, name, bf16_hint=bf16_hint)
        got = _to_4d(a) if a.dtype == _F32 else None
        if got is None:
            a = c_array(a)
            got = _to_4d(a)
    dims, strides = got
    t = _lib.attn_tensor()
    t.data = a.ctypes.data_as(_lib.c_float_p)  # bf16: the library casts back
    t.dim[:] = dims
    t.stride[:] = _natural(dims, strides)
    return a, t


def bf16_array(x, name, min_ndim=2):
    """x as a numpy uint16 array of bfloat16 bit patterns (numpy has no
    bfloat16): uint16 arrays are taken as they are, anything else is refused
    (a float array here is almost surely a mistake, not bits)."""
    a = as_numpy(x)
    if a.dtype != _U16:
        raise ValueError(
            "%s: dtype='bf16' takes bfloat16 bit patterns as a uint16 array, got "
            "dtype %s; convert float values with attn.bf16_from_float32"
            % (name, a.dtype))
    if a.ndim < min_ndim:
        raise ValueError("%s must have shape (..., L, E) with at least %d dims, "
                         "got shape %s" % (name, min_ndim, a.shape))
    return a


def packed_view(x, name):
    """(array kept alive, attn_tensor [1, H, T, D]) for packed rows
    (T, H, D), read in place when float32 with usable strides, else an
    aligned contiguous copy."""
    a = as_float_array(x, name, min_ndim=0, bf16_hint=None)  # varlen: fp32 only
    if a.ndim != 3:
        raise ValueError("%s must have shape (total, H, D), got shape %s"
                         % (name, a.shape))
    st = _elem_strides(a) if a.dtype == _F32 else None
    if st is None:
        a = c_array(a)
        st = _elem_strides(a)
    T, H, D = (int(n) for n in a.shape)
    if min(T, H, D) == 0:
        raise _lib.AttnError(_lib.ATTN_ERR_SHAPE, "%s of shape %s: total, H "
                             "and D must be >= 1" % (name, a.shape))
    dims = (1, H, T, D)
    t = _lib.attn_tensor()
    t.data = a.ctypes.data_as(_lib.c_float_p)
    t.dim[:] = dims
    t.stride[:] = _natural(dims, (0, st[1], st[0], st[2]))
    return a, t


def out_tensor(shape, bf16=False):
    """(new C-contiguous array, attn_tensor): float32, or uint16 bf16 bits."""
    a = np.empty(shape, dtype=_U16 if bf16 else np.float32)
    dims, strides = _to_4d(a)
    t = _lib.attn_tensor()
    t.data = a.ctypes.data_as(_lib.c_float_p)  # bf16: the library casts back
    t.dim[:] = dims
    t.stride[:] = _natural(dims, strides)
    return a, t


def mask_array(m, name):
    """bool -> uint8 view (no copy), floating -> float32. Returns (array,
    is_bool)."""
    m = as_numpy(m)
    if m.dtype == np.bool_:
        return m.view(np.uint8), True
    if m.dtype.kind == "f":
        return (m if m.dtype == _F32 else m.astype(np.float32)), False
    raise ValueError("%s must be bool or floating point, got dtype %s"
                     % (name, m.dtype))


def mask_view(m, lead, Lq, Lk, name):
    """attn_mask for a uint8 or float32 array m that broadcasts (numpy rules)
    to lead + (Lq, Lk). Returns (array kept alive, attn_mask)."""
    target = tuple(lead) + (Lq, Lk)
    if m.ndim > len(target):
        raise ValueError("%s of shape %s has more dims than %s"
                         % (name, m.shape, target))
    try:
        b = np.broadcast_to(m, target)
    except ValueError:
        raise ValueError("%s of shape %s does not broadcast to %s"
                         % (name, m.shape, target)) from None
    got = _to_4d(b)
    if got is None:
        b = c_array(b, b.dtype)
        got = _to_4d(b)
    dims, strides = got
    mv = _lib.attn_mask()
    mv.data = b.ctypes.data_as(ctypes.c_void_p)
    mv.dim[:] = dims
    mv.stride[:] = strides
    return b, mv


def as_index(v, name):
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError("%s must be an integer or None, got %r" % (name, v)) from None


def as_ranged_int(v, name, lo, hi, status, what):
    """operator.index(v), which must lie in [lo, hi]: ctypes would wrap a
    value outside its field silently (seed 2**64 would become seed 0).
    Raises AttnError(status) saying `name must be what, got v`."""
    n = as_index(v, name)
    if not lo <= n <= hi:
        raise _lib.AttnError(status, "%s must be %s, got %d" % (name, what, n))
    return n


def uint64_arg(v, name):
    return as_ranged_int(v, name, 0, 2**64 - 1, _lib.ATTN_ERR_ARG,
                         "in [0, 2^64)")


def int64_arg(v, name, status=_lib.ATTN_ERR_OVERFLOW):
    return as_ranged_int(v, name, -2**63, 2**63 - 1, status, "in [-2^63, 2^63)")

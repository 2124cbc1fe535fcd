"""attn: exact scaled dot-product attention and multi-head attention.

A ctypes binding over libattn (include/attn.h), with PyTorch's interfaces:

    attn.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                      is_causal=False, scale=None, *,
                                      key_padding_lengths=None, window=None,
                                      need_weights=False, seed=0)
    attn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
                            kdim=None, vdim=None, batch_first=True, seed=0)
    attn.last_path()          -> (impl_name, reason) of the last SDPA call
    attn.set_num_threads(n), attn.get_num_threads()

The library is found through ATTN_LIBRARY (full path to libattn.so), else
<repo>/build/libattn.so, else the system library path. Invalid arguments
raise ValueError (attn.AttnError) carrying the library's message.
"""
import ctypes as _ctypes
import operator as _operator

from . import _lib
from ._lib import (ATTN_UNBOUNDED, AttnError, AttnMemoryError, AttnStateError,
                   library_path)
from .functional import last_path, scaled_dot_product_attention
from .mha import MultiheadAttention

__version__ = "0.1.0"

__all__ = ["scaled_dot_product_attention", "MultiheadAttention", "last_path",
           "set_num_threads", "get_num_threads", "AttnError",
           "AttnMemoryError", "AttnStateError", "ATTN_UNBOUNDED",
           "library_path", "__version__"]


def set_num_threads(n):
    """n >= 1: threads for every parallel part of the library; 0 restores the
    default (ATTN_NUM_THREADS if set, else all cores)."""
    n = _operator.index(n)
    if not -2**31 <= n < 2**31:
        raise ValueError("set_num_threads: %d does not fit in an int" % n)
    err = _lib.attn_error()
    _lib.check(_lib.lib.attn_set_num_threads(n, _ctypes.byref(err)), err)


def get_num_threads():
    return int(_lib.lib.attn_get_num_threads())

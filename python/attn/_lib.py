"""ctypes declarations for libattn (include/attn.h).

Every Structure here mirrors the header field for field; python/tests/test_binding.py
(test_struct_layouts_match_header) compiles a small C program against the header and checks sizes and offsets.
"""
import ctypes
import ctypes.util
import os

# ---------------------------------------------------------------- constants

ATTN_OK = 0
ATTN_ERR_NULL = 1
ATTN_ERR_SHAPE = 2
ATTN_ERR_OVERFLOW = 3
ATTN_ERR_MASK = 4
ATTN_ERR_ARG = 5
ATTN_ERR_NOMEM = 6
ATTN_ERR_STATE = 7
ATTN_ERR_ALIAS = 8

ATTN_UNBOUNDED = -1

ATTN_IMPL_AUTO = 0
ATTN_IMPL_REFERENCE = 1
ATTN_IMPL_FUSED = 2
IMPL_NAMES = {ATTN_IMPL_AUTO: "auto", ATTN_IMPL_REFERENCE: "reference",
              ATTN_IMPL_FUSED: "fused"}
IMPL_CODES = {v: k for k, v in IMPL_NAMES.items()}

ATTN_DTYPE_DEFAULT = 0  # dtype: fp32; out_dtype: dtype's (attn.h, 0.5)
ATTN_F32 = 1
ATTN_BF16 = 2  # bfloat16 bits held in uint16

ATTN_WEIGHTS_NONE = 0
ATTN_WEIGHTS_PER_HEAD = 1
ATTN_WEIGHTS_AVERAGE = 2

# ---------------------------------------------------------------- structs

c_float_p = ctypes.POINTER(ctypes.c_float)
c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_uint16_p = ctypes.POINTER(ctypes.c_uint16)


class attn_error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int),
                ("message", ctypes.c_char * 256)]


class attn_tensor(ctypes.Structure):
    _fields_ = [("data", c_float_p),
                ("dim", ctypes.c_int64 * 4),
                ("stride", ctypes.c_int64 * 4)]


class attn_mask(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("dim", ctypes.c_int64 * 4),
                ("stride", ctypes.c_int64 * 4)]


class attn_sdpa_params(ctypes.Structure):
    _fields_ = [("use_scale", ctypes.c_int),
                ("scale", ctypes.c_float),
                ("causal", ctypes.c_int),
                ("key_lengths", c_int64_p),
                ("use_window", ctypes.c_int),
                ("window_left", ctypes.c_int64),
                ("window_right", ctypes.c_int64),
                ("bool_mask", ctypes.POINTER(attn_mask)),
                ("add_mask", ctypes.POINTER(attn_mask)),
                ("dropout_p", ctypes.c_float),
                ("training", ctypes.c_int),
                ("seed", ctypes.c_uint64),
                ("offset", ctypes.c_uint64),
                ("dropout_row0", ctypes.c_int64),
                ("impl", ctypes.c_int),
                ("num_threads", ctypes.c_int),
                ("dtype", ctypes.c_int),
                ("out_dtype", ctypes.c_int),
                ("use_softcap", ctypes.c_int),
                ("softcap", ctypes.c_float),
                ("alibi_slopes", c_float_p),
                ("sinks", c_float_p),
                ("d_sinks", c_float_p)]


class attn_sdpa_info(ctypes.Structure):
    _fields_ = [("impl", ctypes.c_int),
                ("reason", ctypes.c_char * 160)]


class attn_mha_config(ctypes.Structure):
    _fields_ = [("embed_dim", ctypes.c_int64),
                ("num_heads", ctypes.c_int64),
                ("kdim", ctypes.c_int64),
                ("vdim", ctypes.c_int64),
                ("bias", ctypes.c_int),
                ("num_kv_heads", ctypes.c_int64)]


class attn_mha_weights(ctypes.Structure):
    _fields_ = [("w_q", c_float_p), ("w_k", c_float_p),
                ("w_v", c_float_p), ("w_o", c_float_p),
                ("b_q", c_float_p), ("b_k", c_float_p),
                ("b_v", c_float_p), ("b_o", c_float_p)]


class attn_mha_kv_shape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64),
                ("max_len", ctypes.c_int64),
                ("max_step", ctypes.c_int64),
                ("threads", ctypes.c_int)]


class attn_mha_kv(ctypes.Structure):
    _fields_ = [("len", c_int64_p),
                ("k", c_float_p), ("v", c_float_p),
                ("batch", ctypes.c_int64), ("max_len", ctypes.c_int64),
                ("max_step", ctypes.c_int64), ("embed_dim", ctypes.c_int64),
                ("num_heads", ctypes.c_int64),
                ("threads", ctypes.c_int),
                ("work", ctypes.c_void_p),
                ("work_bytes", ctypes.c_size_t),
                ("num_kv_heads", ctypes.c_int64)]


STRUCTS = {
    "attn_error": attn_error,
    "attn_tensor": attn_tensor,
    "attn_mask": attn_mask,
    "attn_sdpa_params": attn_sdpa_params,
    "attn_sdpa_info": attn_sdpa_info,
    "attn_mha_config": attn_mha_config,
    "attn_mha_weights": attn_mha_weights,
    "attn_mha_kv_shape": attn_mha_kv_shape,
    "attn_mha_kv": attn_mha_kv,
}

# The library version these declarations mirror (attn.h's ATTN_VERSION);
# _load refuses a library that reports another (its structs may differ).
ABI_VERSION = "0.6.0"

# ---------------------------------------------------------------- loading


def find_library_path():
    """ATTN_LIBRARY; else, for an installed package, the library path that
    `cmake --install` wrote next to this file (_library_path.txt); else
    <repo>/build/libattn.so in a source tree; else the system search."""
    env = os.environ.get("ATTN_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(
                "attn: ATTN_LIBRARY=%r does not name an existing file; point it "
                "at the built libattn.so (e.g. build/libattn.so after `make build`)"
                % env)
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    baked = os.path.join(here, "_library_path.txt")
    if os.path.isfile(baked):
        with open(baked, encoding="utf-8") as f:
            installed = f.read().rstrip("\n")
        if not os.path.isfile(installed):
            raise ImportError(
                "attn: this installed package (%s) was installed with libattn at "
                "%s, which does not exist; reinstall (`cmake --install build "
                "--prefix ...`) or set ATTN_LIBRARY" % (here, installed))
        return installed
    cand = os.path.normpath(os.path.join(here, "..", "..", "build", "libattn.so"))
    if os.path.isfile(cand):
        return cand
    found = ctypes.util.find_library("attn")
    if found:
        return found
    raise ImportError(
        "attn: cannot find libattn.so. Set ATTN_LIBRARY=/full/path/to/libattn.so, "
        "or build it with `make build` (looked for %s, then the system library "
        "path)" % cand)


def _load():
    path = find_library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError("attn: failed to load %s: %s" % (path, e)) from e

    def fn(name, restype, *argtypes):
        try:
            f = getattr(lib, name)
        except AttributeError as e:
            raise ImportError("attn: %s lacks the symbol %s (stale or partial "
                              "build?)" % (path, name)) from e
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    P = ctypes.POINTER
    err_p = P(attn_error)
    status = ctypes.c_int
    fn("attn_version", ctypes.c_char_p)
    got = lib.attn_version().decode("ascii", "replace")
    if got != ABI_VERSION:
        raise ImportError("attn: %s is libattn %s, but this package is written for %s "
                          "(struct layouts differ between versions); point ATTN_LIBRARY "
                          "at a matching build" % (path, got, ABI_VERSION))
    fn("attn_status_name", ctypes.c_char_p, ctypes.c_int)
    fn("attn_set_num_threads", status, ctypes.c_int, err_p)
    fn("attn_get_num_threads", ctypes.c_int)
    fn("attn_enable_amx", ctypes.c_int)
    fn("attn_cpu_features", ctypes.c_uint)
    fn("attn_bf16_from_f32", None, c_float_p, c_uint16_p, ctypes.c_size_t)
    fn("attn_f32_from_bf16", None, c_uint16_p, c_float_p, ctypes.c_size_t)
    fn("attn_sdpa_forward", status,
       P(attn_tensor), P(attn_tensor), P(attn_tensor), P(attn_sdpa_params),
       P(attn_tensor), c_float_p, c_float_p, P(attn_sdpa_info), err_p)
    fn("attn_sdpa_backward", status,
       P(attn_tensor), P(attn_tensor), P(attn_tensor), P(attn_tensor),
       c_float_p, P(attn_tensor), P(attn_sdpa_params),
       P(attn_tensor), P(attn_tensor), P(attn_tensor), P(attn_sdpa_info),
       err_p)
    fn("attn_sdpa_varlen_forward", status,
       P(attn_tensor), P(attn_tensor), P(attn_tensor), ctypes.c_int64,
       c_int64_p, c_int64_p, P(attn_sdpa_params), P(attn_tensor), c_float_p,
       c_float_p, P(attn_sdpa_info), err_p)
    fn("attn_sdpa_varlen_backward", status,
       P(attn_tensor), P(attn_tensor), P(attn_tensor), P(attn_tensor),
       c_float_p, P(attn_tensor), ctypes.c_int64, c_int64_p, c_int64_p,
       P(attn_sdpa_params), P(attn_tensor), P(attn_tensor), P(attn_tensor),
       P(attn_sdpa_info), err_p)
    fn("attn_mha_param_count", status, P(attn_mha_config),
       P(ctypes.c_size_t), err_p)
    fn("attn_mha_weights_from_buffer", status, P(attn_mha_config), c_float_p,
       P(attn_mha_weights), err_p)
    fn("attn_mha_init", status, P(attn_mha_config), P(attn_mha_weights),
       ctypes.c_uint64, err_p)
    fn("attn_mha_forward", status, P(attn_mha_config), P(attn_mha_weights),
       ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
       c_float_p, c_float_p, c_float_p, P(attn_sdpa_params),
       c_float_p, ctypes.c_int, c_float_p, c_float_p, err_p)
    fn("attn_mha_cache_size", status, P(attn_mha_config),
       ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, P(ctypes.c_size_t),
       err_p)
    fn("attn_mha_backward", status, P(attn_mha_config), P(attn_mha_weights),
       ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
       c_float_p, c_float_p, c_float_p, P(attn_sdpa_params),
       c_float_p, c_float_p, c_float_p, c_float_p, c_float_p,
       P(attn_mha_weights), err_p)
    fn("attn_mha_kv_bytes", status, P(attn_mha_config), P(attn_mha_kv_shape),
       P(ctypes.c_size_t), err_p)
    fn("attn_mha_kv_init", status, P(attn_mha_config), P(attn_mha_kv_shape),
       ctypes.c_void_p, ctypes.c_size_t, P(attn_mha_kv), err_p)
    fn("attn_mha_step", status, P(attn_mha_config), P(attn_mha_weights),
       P(attn_mha_kv), ctypes.c_int64, ctypes.c_int64, c_float_p,
       P(attn_sdpa_params), c_float_p, err_p)
    return lib, path


lib, library_path = _load()

# ---------------------------------------------------------------- errors


class AttnError(ValueError):
    """A libattn call failed; .status is the attn_status code, .status_name
    its name, and the message is the library's attn_error.message."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = status_name(status)
        self.library_message = message
        super().__init__("%s [%s]" % (message, self.status_name))


class AttnMemoryError(MemoryError):
    """ATTN_ERR_NOMEM."""


class AttnStateError(RuntimeError):
    """ATTN_ERR_STATE."""


def status_name(s):
    name = lib.attn_status_name(int(s))
    return name.decode("ascii", "replace") if name else "ATTN_ERR_%d" % int(s)


def check(status, err):
    """Raise for a non-OK status, with the library's message."""
    if status == ATTN_OK:
        return
    msg = err.message.decode("utf-8", "replace") or status_name(status)
    if status == ATTN_ERR_NOMEM:
        raise AttnMemoryError("%s [%s]" % (msg, status_name(status)))
    if status == ATTN_ERR_STATE:
        raise AttnStateError("%s [%s]" % (msg, status_name(status)))
    raise AttnError(status, msg)


def float_ptr(a):
    """float* to a float32 ndarray's data (None for None)."""
    if a is None:
        return None
    return a.ctypes.data_as(c_float_p)

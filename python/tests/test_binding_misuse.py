"""The binding used wrongly: the parameter and gradient buffers, kdim/vdim
0, misaligned arrays, integer arguments that ctypes would wrap and the one
zero-size rule.

Oracles: PyTorch 1.13 in float64 (its private
torch.nn.functional._scaled_dot_product_attention for the zero-size
shapes, the math path of _oracle, torch.nn.MultiheadAttention and
autograd), the documented packed parameter layout, and the C library's own
status for the same argument. Cases that corrupted memory before the fix run
in a child interpreter, so a crash (rc 139) is reported as a failure instead
of ending the session.
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")
import torch.nn.functional as F

import attn
from attn import _lib
from _oracle import (check_close, check_grad, rand, structural_keep,
                     torch_sdpa_grad)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(attn.__file__)))


def run_isolated(code):
    """Run code in a child /usr/bin/python3 (the same attn package and
    library); returns (returncode, stdout + stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    env["ATTN_NUM_THREADS"] = "1"
    pre = "import numpy as np, attn\n"
    r = subprocess.run([sys.executable, "-c", pre + code], env=env,
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def misaligned(a):
    """A copy of a whose data starts one byte past an aligned address."""
    a = np.ascontiguousarray(a)
    raw = bytearray(a.nbytes + 1)
    m = np.frombuffer(raw, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    m[...] = a
    assert not m.flags.aligned
    return m


def _t(x, requires_grad=False):
    t = torch.from_numpy(np.array(x, dtype=np.float64))
    return t.requires_grad_(True) if requires_grad else t


def packed_to_torch_names(buf, E, bias=True):
    """The documented packed layout (w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o)
    for kdim == vdim == E, under torch.nn.MultiheadAttention's names."""
    buf = np.asarray(buf, np.float64)
    n_in = 3 * E * E
    d = {"in_proj_weight": buf[:n_in].reshape(3 * E, E)}
    off = n_in
    if bias:
        d["in_proj_bias"] = buf[off:off + 3 * E]
        off += 3 * E
    d["out_proj.weight"] = buf[off:off + E * E].reshape(E, E)
    off += E * E
    if bias:
        d["out_proj.bias"] = buf[off:off + E]
        off += E
    assert off == buf.size
    return d


def torch_mha(state, E, H, bias=True, kdim=None, vdim=None, batch_first=True):
    t = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim,
                                    batch_first=batch_first).double()
    t.load_state_dict({k: torch.from_numpy(np.array(v, np.float64))
                       for k, v in state.items()}, strict=True)
    return t


# ============================================================ item 1: buffers

E16, H4 = 16, 4
_COUNT16 = 4 * E16 * E16 + 4 * E16  # parameter count of MultiheadAttention(16, 4)

BAD_BUFFERS = {
    "size 3": "np.zeros(3, np.float32)",
    "one too many": "np.zeros(%d, np.float32)" % (_COUNT16 + 1),
    "2-D of the right size": "np.zeros((%d, 1), np.float32)" % _COUNT16,
    "complex": "np.zeros(%d, np.complex64)" % _COUNT16,
    "strings": "np.array(['1'] * %d)" % _COUNT16,
    "bool": "np.zeros(%d, bool)" % _COUNT16,
}


@pytest.mark.parametrize("attr", ["parameters_buffer", "grads_buffer"])
@pytest.mark.parametrize("bad", sorted(BAD_BUFFERS))
def test_bad_buffer_assignment_refused(attr, bad):
    # before the fix the assignment was accepted and
    # backward wrote out of bounds (rc 139), forward read out of bounds
    code = """
m = attn.MultiheadAttention(16, 4)
x = np.ones((2, 5, 16), np.float32)
y, _ = m(x, x, x)
m.backward(np.ones_like(y))
try:
    m.%s = %s
except ValueError as e:
    print("REFUSED", e)
else:
    y, _ = m(x, x, x)
    m.backward(np.ones_like(y), accumulate=True)
    m.requires_grad = False
    y, _ = m(x, x, x)
    print("ACCEPTED")
""" % (attr, BAD_BUFFERS[bad])
    rc, out = run_isolated(code)
    assert rc == 0, "rc %d: %s" % (rc, out[-2000:])
    assert "REFUSED" in out and attr in out, out[-2000:]


def test_buffers_cannot_be_resized_in_place():
    # the library holds pointers into both buffers: resize() would move them
    m = attn.MultiheadAttention(E16, H4)
    x = np.ones((2, 5, E16), np.float32)
    y, _ = m(x, x, x)
    m.backward(np.ones_like(y))
    for buf in (m.parameters_buffer, m.grads_buffer):
        with pytest.raises(ValueError):
            buf.resize(3, refcheck=False)
        assert buf.shape == (_COUNT16,)


def test_replaced_parameters_buffer_used_by_every_path():
    # `m.parameters_buffer = m.parameters_buffer - 0.5 *
    # m.grads_buffer` was used by a requires_grad=True forward but ignored
    # by a requires_grad=False one (outputs differed by 51)
    rng = np.random.default_rng(11)
    m = attn.MultiheadAttention(E16, H4, seed=3)
    x = rand(rng, 2, 5, E16)
    y, _ = m(x, x, x)
    m.backward(rand(rng, *y.shape))
    new = m.parameters_buffer.astype(np.float64) - 0.5 * m.grads_buffer
    m.parameters_buffer = m.parameters_buffer - 0.5 * m.grads_buffer
    new32 = new.astype(np.float32)
    np.testing.assert_array_equal(m.parameters_buffer, new32)
    # the named views are the same buffer
    names = packed_to_torch_names(new32, E16)
    np.testing.assert_array_equal(m.in_proj_weight, names["in_proj_weight"])
    np.testing.assert_array_equal(m.out_proj_bias, names["out_proj.bias"])
    tm = torch_mha(names, E16, H4)
    X = _t(x, True)
    ref, _ = tm(X, X, X, need_weights=False)
    g = rand(rng, 2, 5, E16)
    ref.backward(_t(g))
    for rg in (True, False, True):
        m.requires_grad = rg
        out, _ = m(x, x, x)
        check_close("misuse/replaced-buffer/out", out, ref.detach().numpy())
    dx, _, _ = m.backward(g)
    check_grad("misuse", "replaced-buffer", "d_query", dx, X.grad.numpy())
    tparams = dict(tm.named_parameters())
    check_grad("misuse", "replaced-buffer", "in_proj_weight",
               m.grads["in_proj_weight"], tparams["in_proj_weight"].grad.numpy())
    check_grad("misuse", "replaced-buffer", "out_proj_bias",
               m.grads["out_proj_bias"], tparams["out_proj.bias"].grad.numpy())


@pytest.mark.parametrize("layout", ["float64", "transposed", "misaligned",
                                    "torch"])
def test_named_parameter_assignment_any_layout(layout):
    # a named view accepts any real array of its exact shape and copies it
    # into the one buffer: both forward modes use it
    rng = np.random.default_rng(12)
    m = attn.MultiheadAttention(E16, H4, seed=4)
    w = rand(rng, E16, E16)
    src = {"float64": w.astype(np.float64),
           "transposed": np.ascontiguousarray(w.T).T,
           "misaligned": misaligned(w),
           "torch": torch.from_numpy(w.copy()).requires_grad_(True)}[layout]
    m.out_proj_weight = src
    np.testing.assert_array_equal(m.out_proj_weight, w)
    assert np.shares_memory(m.out_proj_weight, m.parameters_buffer)
    x = rand(rng, 2, 5, E16)
    tm = torch_mha(m.state_dict(), E16, H4)
    state = packed_to_torch_names(m.parameters_buffer, E16)
    np.testing.assert_array_equal(state["out_proj.weight"], w)
    ref, _ = tm(_t(x), _t(x), _t(x), need_weights=False)
    for rg in (False, True):
        m.requires_grad = rg
        out, _ = m(x, x, x)
        check_close("misuse/named-assign/out", out, ref.detach().numpy())


def test_named_parameter_bad_assignment_refused():
    m = attn.MultiheadAttention(E16, H4)
    before = m.parameters_buffer.copy()
    for bad in (np.zeros((E16, E16 + 1), np.float32), np.zeros(E16 * E16, np.float32),
                np.zeros((E16, E16), np.complex64), np.zeros((E16, E16), bool),
                np.full((E16, E16), "x")):
        with pytest.raises(ValueError, match="out_proj_weight"):
            m.out_proj_weight = bad
    with pytest.raises(ValueError, match="in_proj_bias"):
        m.in_proj_bias = np.zeros(3 * E16 + 1)
    np.testing.assert_array_equal(m.parameters_buffer, before)


def test_assigned_grads_buffer_accumulates():
    # grads_buffer is assignable: exact shape, copied into the module's own
    # float32 buffer, which accumulate=True then adds into (before: a
    # float64 array was handed to C as float*)
    rng = np.random.default_rng(13)
    m = attn.MultiheadAttention(E16, H4, seed=5)
    x = rand(rng, 2, 5, E16)
    g = rand(rng, 2, 5, E16)
    g0 = rng.standard_normal(m.parameters_buffer.size)  # float64
    m.grads_buffer = g0
    assert m.grads_buffer.dtype == np.float32
    for n, a in m.grads.items():
        assert np.shares_memory(a, m.grads_buffer), n
    m(x, x, x)
    m.backward(g, accumulate=True)
    tm = torch_mha(m.state_dict(), E16, H4)
    X = _t(x, True)
    ref, _ = tm(X, X, X, need_weights=False)
    ref.backward(_t(g))
    torch_grad = np.concatenate([
        p.grad.numpy().reshape(-1) for p in
        (tm.in_proj_weight, tm.in_proj_bias, tm.out_proj.weight, tm.out_proj.bias)])
    check_close("misuse/grads-buffer/accumulated", m.grads_buffer,
                g0.astype(np.float32).astype(np.float64) + torch_grad)
    m.grads_buffer = None
    assert m.grads is None and m.grads_buffer is None


def test_config_attributes_are_read_only():
    # kdim, vdim, embed_dim, num_heads size the library's config and the
    # buffers: changing one afterwards made forward check the new width and
    # the library read the old one
    m = attn.MultiheadAttention(8, 2, kdim=6, vdim=5)
    for name, value in (("kdim", 2), ("vdim", 2), ("embed_dim", 4),
                        ("num_heads", 1), ("head_dim", 1), ("bias", False)):
        with pytest.raises(AttributeError, match=name):
            setattr(m, name, value)
    assert (m.embed_dim, m.num_heads, m.kdim, m.vdim, m.head_dim, m.bias) == \
        (8, 2, 6, 5, 4, True)
    with pytest.raises(ValueError, match="dropout"):
        m.dropout = 1.0
    with pytest.raises(ValueError, match="dropout"):
        m.dropout = float("nan")


# ============================================================ item 2: kdim 0

def _c_config_status(E, H, kdim, vdim):
    """The C library's status for attn_mha_param_count of this config."""
    c = _lib.attn_mha_config()
    c.embed_dim, c.num_heads, c.kdim, c.vdim, c.bias = E, H, kdim, vdim, 1
    n = ctypes.c_size_t()
    err = _lib.attn_error()
    st = _lib.lib.attn_mha_param_count(ctypes.byref(c), ctypes.byref(n),
                                       ctypes.byref(err))
    return st, err.message.decode()


@pytest.mark.parametrize("kw", ["kdim=0", "vdim=0", "kdim=-1", "vdim=-3",
                                "kdim=0, vdim=0"])
def test_kdim_vdim_zero_or_negative_refused(kw):
    # kdim=0 was a width of 0 in Python and "embed_dim" in
    # C, which then read B*L*8 floats from an empty key (SIGSEGV)
    code = """
try:
    m = attn.MultiheadAttention(8, 2, %s)
except ValueError as e:
    print("REFUSED", e.status_name, e)
else:
    x = np.ones((2, 5, 8), np.float32)
    k = np.ones((2, 5, m.kdim), np.float32)
    v = np.ones((2, 5, m.vdim), np.float32)
    y, _ = m(x, k, v)
    m.backward(np.ones_like(y))
    print("ACCEPTED", np.isfinite(y).all())
""" % kw
    rc, out = run_isolated(code)
    assert rc == 0, "rc %d: %s" % (rc, out[-2000:])
    # the library's status for a width it cannot take, in its words
    st, msg = _c_config_status(8, 2, -1, 8)
    assert "kdim (-1) and vdim (8) must be" in msg
    assert "REFUSED %s" % _lib.status_name(st) in out, out
    assert "must be > 0 (None: embed_dim)" in out, out


@pytest.mark.parametrize("kw,exc", [
    (dict(embed_dim=8.5, num_heads=2), ValueError),
    (dict(embed_dim=8, num_heads=2.0), ValueError),
    (dict(embed_dim=2**64 + 8, num_heads=2), ValueError),
    (dict(embed_dim=8, num_heads=2**64 + 2), ValueError),
    (dict(embed_dim=8, num_heads=2, kdim=2**64 + 4), ValueError),
    (dict(embed_dim=8, num_heads=2, vdim="4"), ValueError),
    (dict(embed_dim=8, num_heads=2, seed=2**64), ValueError),
    (dict(embed_dim=8, num_heads=2, seed=-1), ValueError),
    (dict(embed_dim=8, num_heads=2, seed=1.5), ValueError),
])
def test_mha_integer_arguments_do_not_wrap(kw, exc):
    # before: int() truncated 8.5 to 8, ctypes wrapped 2**64 + 8 to 8 and the
    # seed was masked to 64 bits (seed=2**64 was seed 0)
    with pytest.raises(exc):
        attn.MultiheadAttention(**kw)


def test_mha_seed_assignment_checked():
    m = attn.MultiheadAttention(8, 2, dropout=0.5, seed=2**64 - 1)
    assert m.seed == 2**64 - 1
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^64\)"):
            m.seed = bad
    assert m.seed == 2**64 - 1


# ============================================================ item 9: alignment

SDPA_ARRAYS = ["query", "key", "value", "attn_mask", "grad_out",
               "key_padding_lengths"]


@pytest.mark.parametrize("which", SDPA_ARRAYS)
def test_misaligned_sdpa_inputs(which):
    # a misaligned float32 array raised "TypeError: cannot
    # unpack non-iterable NoneType object"; now it is copied
    rng = np.random.default_rng(90)
    B, H, Lq, Lk, D = 2, 3, 5, 7, 8
    a = {"query": rand(rng, B, H, Lq, D), "key": rand(rng, B, H, Lk, D),
         "value": rand(rng, B, H, Lk, D), "attn_mask": rand(rng, Lq, Lk),
         "grad_out": rand(rng, B, H, Lq, D),
         "key_padding_lengths": np.array([7, 4], np.int64)}
    args = dict(a)
    args[which] = misaligned(a[which])
    kw = dict(attn_mask=args["attn_mask"],
              key_padding_lengths=args["key_padding_lengths"])
    out = attn.scaled_dot_product_attention(args["query"], args["key"],
                                            args["value"], **kw)
    dq, dk, dv = attn.scaled_dot_product_attention_grad(
        args["grad_out"], args["query"], args["key"], args["value"], **kw)
    keep = structural_keep((B, H), Lq, Lk, key_lengths=[7, 4])
    ref = torch_sdpa_grad(a["query"], a["key"], a["value"], a["grad_out"],
                          keep=keep, add=a["attn_mask"])
    check_close("misuse/misaligned/out", out, ref[0])
    for name, ours, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:]):
        check_grad("misuse", "misaligned-" + which, name, ours, r)


@pytest.mark.parametrize("mask", ["attn_mask", "key_padding_mask"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_misaligned_mha_inputs(requires_grad, mask):
    # (one float mask per call: PyTorch 1.13 reads a float key_padding_mask
    # next to a float attn_mask as bool)
    rng = np.random.default_rng(91)
    m = attn.MultiheadAttention(E16, H4, kdim=6, vdim=5, seed=6)
    m.requires_grad = requires_grad
    q, k, v = rand(rng, 2, 5, E16), rand(rng, 2, 7, 6), rand(rng, 2, 7, 5)
    mk = rand(rng, *((5, 7) if mask == "attn_mask" else (2, 7)))
    out, w = m(misaligned(q), misaligned(k), misaligned(v),
               **{mask: misaligned(mk)})
    tm = torch_mha(m.state_dict(), E16, H4, kdim=6, vdim=5)
    Q, K, V = _t(q, True), _t(k, True), _t(v, True)
    ref, ref_w = tm(Q, K, V, **{mask: _t(mk)})
    check_close("misuse/misaligned-mha/out", out, ref.detach().numpy())
    check_close("misuse/misaligned-mha/weights", w, ref_w.detach().numpy())
    if requires_grad:
        g = rand(rng, *out.shape)
        dq, dk, dv = m.backward(misaligned(g))
        ref.backward(_t(g))
        for name, ours, r in (("d_query", dq, Q), ("d_key", dk, K),
                              ("d_value", dv, V)):
            check_grad("misuse", "misaligned-mha", name, ours, r.grad.numpy())


# ====================================================== item 14: int ranges

@pytest.mark.parametrize("name", ["seed", "offset"])
@pytest.mark.parametrize("value", [2**64, 2**64 + 7, -1, -2**63])
def test_sdpa_seed_offset_out_of_range(name, value):
    # before: masked to 64 bits, so seed=2**64 silently was seed 0
    rng = np.random.default_rng(140)
    q = rand(rng, 2, 5, 8)
    kw = {name: value, "dropout_p": 0.5}
    with pytest.raises(attn.AttnError, match=r"%s must be in \[0, 2\^64\)" % name) as e:
        attn.scaled_dot_product_attention(q, q, q, **kw)
    assert e.value.status == _lib.ATTN_ERR_ARG
    with pytest.raises(ValueError, match=name):
        attn.scaled_dot_product_attention_grad(q, q, q, q, **kw)


def test_sdpa_largest_seed_is_not_seed_zero():
    rng = np.random.default_rng(141)
    q = rand(rng, 1, 16, 8)
    a = attn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=2**64 - 1)
    b = attn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=0)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("kw", [dict(num_threads=2**32), dict(num_threads=-2**40),
                                dict(window=(2**64, 0)), dict(window=(0, 2**63)),
                                dict(window=(-2**63 - 1, 0))])
def test_sdpa_integer_arguments_do_not_wrap(kw):
    # before: ctypes wrapped them (num_threads 2**32 -> 0, window 2**64 -> 0)
    rng = np.random.default_rng(142)
    q = rand(rng, 2, 5, 8)
    with pytest.raises(attn.AttnError) as e:
        attn.scaled_dot_product_attention(q, q, q, **kw)
    assert e.value.status == _lib.ATTN_ERR_ARG


def test_scale_that_rounds_to_zero_is_zero():
    # before: 1e-46 became float32 0, which the library reads as "default"
    rng = np.random.default_rng(143)
    q, k, v = rand(rng, 2, 5, 8), rand(rng, 2, 6, 8), rand(rng, 2, 6, 3)
    out, w = attn.scaled_dot_product_attention(q, k, v, scale=1e-46,
                                               need_weights=True)
    ref = torch_sdpa_grad(q, k, v, np.ones((2, 5, 3)), scale=1e-46)
    check_close("misuse/tiny-scale/out", out, ref[0])
    np.testing.assert_allclose(w, 1.0 / 6, rtol=1e-6)
    with pytest.raises(attn.AttnError, match="scale"):
        attn.scaled_dot_product_attention(q, k, v, scale=1e300)


# ================================================= item 14: zero-size dims

# (B, H, Lq, Lk, Dk, Dv) with one dim 0; PyTorch 1.13 gives a result for each
ZERO_CASES = {"B": (0, 2, 3, 4, 5, 6), "H": (2, 0, 3, 4, 5, 6),
              "Lq": (2, 3, 0, 4, 5, 6), "Lk": (2, 3, 4, 0, 5, 6),
              "Dk": (2, 3, 4, 5, 0, 6), "Dv": (2, 3, 4, 5, 6, 0),
              "Lk and Dk": (2, 3, 4, 0, 0, 6), "Lq and Lk": (2, 3, 0, 0, 5, 6)}


def _torch_private_sdpa(q, k, v, grad_out):
    """PyTorch 1.13's own SDPA (torch.nn.functional._scaled_dot_product_attention)
    in float64 with autograd: (out, weights, dq, dk, dv)."""
    Q, K, V = _t(q, True), _t(k, True), _t(v, True)
    out, w = F._scaled_dot_product_attention(Q, K, V, None, 0.0, True, False)
    out.backward(_t(grad_out))
    return tuple(t.detach().numpy() for t in (out, w, Q.grad, K.grad, V.grad))


def _exact_or_close(label, ours, ref):
    assert ours.shape == ref.shape, (label, ours.shape, ref.shape)
    assert ours.dtype == np.float32, label
    if ref.size:
        check_close(label, ours, ref, nan_means_zero=False)


@pytest.mark.parametrize("case", sorted(ZERO_CASES))
def test_sdpa_zero_size_dims_match_pytorch(case):
    # one rule in every entry point: PyTorch's result (before: Lq = 0 and
    # Dv = 0 returned empty arrays, Lk = 0 and Dk = 0 raised, and Dv = 0
    # with need_weights raised)
    B, H, Lq, Lk, Dk, Dv = ZERO_CASES[case]
    rng = np.random.default_rng(144)
    q, k, v = rand(rng, B, H, Lq, Dk), rand(rng, B, H, Lk, Dk), rand(rng, B, H, Lk, Dv)
    g = rand(rng, B, H, Lq, Dv)
    ref = _torch_private_sdpa(q, k, v, g)
    out = attn.scaled_dot_product_attention(q, k, v)
    _exact_or_close("misuse/zero-%s/out" % case, out, ref[0])
    out, w = attn.scaled_dot_product_attention(q, k, v, need_weights=True)
    _exact_or_close("misuse/zero-%s/out" % case, out, ref[0])
    _exact_or_close("misuse/zero-%s/weights" % case, w, ref[1])
    grads = attn.scaled_dot_product_attention_grad(g, q, k, v)
    for name, ours, r in zip(("dq", "dk", "dv"), grads, ref[2:]):
        _exact_or_close("misuse/zero-%s/%s" % (case, name), ours, r)
    # unbatched (no leading dims) too, where that dim exists
    if B and H:
        out = attn.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0])
        _exact_or_close("misuse/zero-%s/out" % case, out, ref[0][0, 0])


def test_sdpa_zero_dk_with_masks_and_dropout():
    # Dk = 0: every score is 0, so the weights are uniform over the keys the
    # masks leave (dropout applied as usual); a row with no key gives 0
    rng = np.random.default_rng(145)
    B, H, Lq, Lk, Dv = 2, 3, 5, 7, 4
    q, k = np.zeros((B, H, Lq, 0), np.float32), np.zeros((B, H, Lk, 0), np.float32)
    v, g = rand(rng, B, H, Lk, Dv), rand(rng, B, H, Lq, Dv)
    add = rand(rng, H, Lq, Lk)
    lengths = [7, 0]
    keep = structural_keep((B, H), Lq, Lk, causal=True, key_lengths=lengths)
    kw = dict(attn_mask=add, is_causal=True, key_padding_lengths=lengths)
    out, w = attn.scaled_dot_product_attention(q, k, v, need_weights=True, **kw)
    ref = torch_sdpa_grad(q, k, v, g, keep=keep, add=add, scale=1.0)
    check_close("misuse/zero-Dk-masked/out", out, ref[0])
    assert np.all(out[1] == 0)  # key_padding_lengths 0: no key at all
    dq, dk, dv = attn.scaled_dot_product_attention_grad(g, q, k, v, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape
    check_grad("misuse", "zero-Dk-masked", "dv", dv, ref[3])
    # dropout: the same mask as the same call with Dk = 1 and zero q, k
    q1, k1 = np.zeros((B, H, Lq, 1), np.float32), np.zeros((B, H, Lk, 1), np.float32)
    kw.update(dropout_p=0.4, seed=8, offset=2)
    a = attn.scaled_dot_product_attention(q, k, v, **kw)
    b = attn.scaled_dot_product_attention(q1, k1, v, scale=1.0, **kw)
    np.testing.assert_array_equal(a, b)


def test_sdpa_zero_lk_with_masks():
    rng = np.random.default_rng(146)
    q = rand(rng, 2, 3, 4, 5)
    k, v = np.zeros((2, 3, 0, 5), np.float32), np.zeros((2, 3, 0, 6), np.float32)
    for kw in (dict(attn_mask=np.zeros((4, 0), bool)),
               dict(attn_mask=np.zeros((2, 1, 4, 0), np.float32), is_causal=True),
               dict(key_padding_lengths=[0, 0], window=(1, 1)),
               dict(dropout_p=0.3, seed=2)):
        out, w = attn.scaled_dot_product_attention(q, k, v, need_weights=True, **kw)
        assert out.shape == (2, 3, 4, 6) and np.all(out == 0)
        assert w.shape == (2, 3, 4, 0)
        dq, dk, dv = attn.scaled_dot_product_attention_grad(
            rand(rng, 2, 3, 4, 6), q, k, v, **kw)
        assert np.all(dq == 0) and dq.shape == q.shape
        assert dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("case,kw,match", [
    ("Lq", dict(dropout_p=1.5), "dropout_p"),
    ("Lq", dict(window=(-2, 0)), "window"),
    ("Lq", dict(key_padding_lengths=[5, 0]), "key_lengths"),
    ("Lk", dict(key_padding_lengths=[1, 0]), "key_lengths"),
    ("Lk", dict(attn_mask=np.zeros((4, 2), bool)), "attn_mask"),
    ("Dv", dict(num_threads=-1), "num_threads"),
    ("B", dict(impl="fast"), "impl"),
    ("Dk", dict(scale=float("inf")), "scale"),
    ("H", dict(attn_mask=np.zeros((3, 4, 4), bool)), "attn_mask"),
])
def test_sdpa_zero_size_still_validates(case, kw, match):
    # an empty problem checks its arguments like any other (before: Lq = 0
    # returned an empty array whatever dropout_p, window, key lengths)
    B, H, Lq, Lk, Dk, Dv = ZERO_CASES[case]
    q, k, v = (np.zeros(s, np.float32) for s in
               ((B, H, Lq, Dk), (B, H, Lk, Dk), (B, H, Lk, Dv)))
    with pytest.raises(ValueError, match=match):
        attn.scaled_dot_product_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match=match):
        attn.scaled_dot_product_attention_grad(np.zeros((B, H, Lq, Dv), np.float32),
                                               q, k, v, **kw)


@pytest.mark.parametrize("case", ["Lq", "Lk", "B"])
def test_sdpa_zero_size_shape_mismatch(case):
    B, H, Lq, Lk, Dk, Dv = ZERO_CASES[case]
    q = np.zeros((B, H, Lq, Dk), np.float32)
    with pytest.raises(ValueError, match="head size"):
        attn.scaled_dot_product_attention(q, np.zeros((B, H, Lk, Dk + 1), np.float32),
                                          np.zeros((B, H, Lk, Dv), np.float32))
    with pytest.raises(ValueError, match="length"):
        attn.scaled_dot_product_attention(q, np.zeros((B, H, Lk, Dk), np.float32),
                                          np.zeros((B, H, Lk + 1, Dv), np.float32))


# (B, Lq, Lk): PyTorch's nn.MultiheadAttention gives a result for each
MHA_ZERO = {"B": (0, 3, 4), "Lq": (2, 0, 4), "Lk": (2, 3, 0), "Lq and Lk": (2, 0, 0)}


@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("layout", ["batch_first", "seq_first", "unbatched"])
@pytest.mark.parametrize("case", sorted(MHA_ZERO))
def test_mha_zero_size_matches_pytorch(case, layout, requires_grad):
    B, Lq, Lk = MHA_ZERO[case]
    if layout == "unbatched":
        if B != 2:
            pytest.skip("unbatched has no batch dim")
        B = 1
    E, H, kd, vd = 8, 2, 6, 5
    rng = np.random.default_rng(147)
    m = attn.MultiheadAttention(E, H, kdim=kd, vdim=vd,
                                batch_first=layout != "seq_first", seed=7)
    m.in_proj_bias = rand(rng, 3 * E)
    m.out_proj_bias = rand(rng, E)
    m.requires_grad = requires_grad

    def lay(a):  # [B, L, D] -> the layout under test
        if layout == "unbatched":
            return a[0]
        return a if layout == "batch_first" else np.ascontiguousarray(a.transpose(1, 0, 2))

    q, k, v = (lay(rand(rng, B, L, D)) for L, D in ((Lq, E), (Lk, kd), (Lk, vd)))
    kpm = np.zeros((B, Lk), bool)
    kpm = kpm[0] if layout == "unbatched" else kpm
    tm = torch_mha(m.state_dict(), E, H, kdim=kd, vdim=vd,
                   batch_first=layout != "seq_first")
    Q, K, V = _t(q, True), _t(k, True), _t(v, True)
    for avg in (True, False):
        out, w = m(q, k, v, key_padding_mask=kpm, average_attn_weights=avg)
        ref, ref_w = tm(Q, K, V, key_padding_mask=torch.from_numpy(kpm),
                        average_attn_weights=avg)
        _exact_or_close("misuse/mha-zero-%s/out" % case, out, ref.detach().numpy())
        _exact_or_close("misuse/mha-zero-%s/weights" % case, w,
                        ref_w.detach().numpy())
    if not requires_grad:
        with pytest.raises(RuntimeError):
            m.backward(np.zeros(out.shape, np.float32))
        return
    g = rand(rng, *out.shape)
    d = m.backward(g)
    ref.backward(_t(g))
    for name, ours, r in zip(("d_query", "d_key", "d_value"), d, (Q, K, V)):
        _exact_or_close("misuse/mha-zero-%s/%s" % (case, name), ours,
                        r.grad.numpy())
    tparams = dict(tm.named_parameters())
    names = {"q_proj_weight": "q_proj_weight", "k_proj_weight": "k_proj_weight",
             "v_proj_weight": "v_proj_weight", "in_proj_bias": "in_proj_bias",
             "out_proj_weight": "out_proj.weight", "out_proj_bias": "out_proj.bias"}
    assert set(m.grads) == set(names)
    for n, tn in names.items():
        r = tparams[tn].grad
        r = np.zeros(tparams[tn].shape) if r is None else r.numpy()
        _exact_or_close("misuse/mha-zero-%s/%s" % (case, n), m.grads[n], r)

"""The binding itself: struct layouts vs the header, library lookup, API."""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import attn
from attn import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER_DIR = os.path.join(ROOT, "include")

FIELDS = {name: [f[0] for f in cls._fields_] for name, cls in _lib.STRUCTS.items()}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_struct_layouts_match_header(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "attn.h"',
             "int main(void) {"]
    for name, fields in FIELDS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (name, name))
        for f in fields:
            lines.append('printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), '
                         'sizeof(((%s *)0)->%s));' % (name, f, name, f, name, f))
    lines.append('printf("ATTN_UNBOUNDED %d\\n", (int)ATTN_UNBOUNDED);')
    lines.append('printf("enum_size %zu\\n", sizeof(attn_impl));')
    lines.append("return 0; }")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)],
                   check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    c = {}
    for line in got:
        parts = line.split()
        if len(parts) == 3 and parts[1] == "sizeof":
            c[(parts[0], None)] = (int(parts[2]),)
        elif len(parts) == 4:
            c[(parts[0], parts[1])] = (int(parts[2]), int(parts[3]))
        elif len(parts) == 2:
            c[parts[0]] = int(parts[1])
    for name, cls in _lib.STRUCTS.items():
        assert ctypes.sizeof(cls) == c[(name, None)][0], name
        for f in FIELDS[name]:
            desc = getattr(cls, f)
            assert (desc.offset, desc.size) == c[(name, f)], (name, f)
    assert c["ATTN_UNBOUNDED"] == attn.ATTN_UNBOUNDED
    assert c["enum_size"] == ctypes.sizeof(ctypes.c_int)


def _import_with(env_updates):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))  # this tree's attn
    env.update(env_updates)
    env = {k: v for k, v in env.items() if v is not None}
    code = "import attn; print(attn.library_path)"
    return subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True)


def test_library_lookup_env():
    r = _import_with({"ATTN_LIBRARY": "/nonexistent/libattn.so"})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "ATTN_LIBRARY" in r.stderr
    r = _import_with({"ATTN_LIBRARY": attn.library_path})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == attn.library_path


def test_library_is_a_usable_build():
    # the same numbers through the reference path and the library's default
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    a = attn.scaled_dot_product_attention(q, q, q, impl="reference")
    assert a.shape == (2, 3, 4, 8) and a.dtype == np.float32


def test_status_names():
    assert _lib.status_name(0) == "ATTN_OK"
    assert _lib.status_name(_lib.ATTN_ERR_SHAPE) == "ATTN_ERR_SHAPE"
    assert _lib.status_name(_lib.ATTN_ERR_MASK) == "ATTN_ERR_MASK"
    assert isinstance(_lib.status_name(999), str)


def test_public_api():
    for name in ("scaled_dot_product_attention", "MultiheadAttention", "last_path",
                 "set_num_threads", "get_num_threads", "AttnError"):
        assert hasattr(attn, name)
    assert issubclass(attn.AttnError, ValueError)
    assert attn.__version__ == "0.6.0"
    assert _lib.lib.attn_version().decode() == attn.__version__

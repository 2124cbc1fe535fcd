"""The molgen binary the Python tests drive: $MOLGEN_BIN, else
<dir of $ATTN_LIBRARY>/molgen/molgen (set by `make test-python`), else
build/molgen/molgen."""
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def molgen_binary():
    cands = []
    if os.environ.get("MOLGEN_BIN"):
        cands.append(os.environ["MOLGEN_BIN"])
    if os.environ.get("ATTN_LIBRARY"):
        cands.append(os.path.join(os.path.dirname(os.environ["ATTN_LIBRARY"]), "molgen", "molgen"))
    cands.append(os.path.join(REPO, "build", "molgen", "molgen"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.fail("molgen binary not found (tried %s); build it or set MOLGEN_BIN" % cands)

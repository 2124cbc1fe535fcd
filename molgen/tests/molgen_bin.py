"""What the Python tests of molgen share: the binary they drive
($MOLGEN_BIN, else <dir of $ATTN_LIBRARY>/molgen/molgen (set by `make
test-python`), else build/molgen/molgen) and small data files cut from the
shipped sample data/moses_20k.smi."""
import importlib.util
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA20K = os.path.join(REPO, "data", "moses_20k.smi")


def load_file(name, path):
    """The Python file at path (a script of bench/ or tools/, another test
    file) imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def first_molecules(n):
    """The first n SMILES of data/moses_20k.smi."""
    with open(DATA20K) as f:
        return [next(f).split()[0] for _ in range(n)]


def write_molecules(directory, n, name="mols.smi"):
    """first_molecules(n), one per line, in directory/name: (path, mols)."""
    mols = first_molecules(n)
    path = os.path.join(str(directory), name)
    with open(path, "w") as f:
        f.write("\n".join(mols) + "\n")
    return path, mols


# train's flags for the tests' tiny model (1 layer, d_model 16, 2 heads,
# batches of 8, one thread, no progress or validation lines)
TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "8",
        "--no-progress", "--val-every", "0", "--threads", "1"]


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


# what the tests run molgen with: the project's OpenBLAS setting, passive waits
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def run_molgen(args, ok=True, timeout=300):
    """molgen ARGS; with ok, assert it exited 0 (its stderr is the message)."""
    p = subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                       timeout=timeout, env=ENV)
    if ok:
        assert p.returncode == 0, p.stderr
    return p

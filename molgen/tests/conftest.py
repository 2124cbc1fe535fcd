"""Makes every test file under molgen/tests run alone, from any directory
(`pytest molgen/tests/mpi/test_mpi.py`, not only through make or ctest):
the shared helper module molgen_bin (this directory) and the molgen / attn
Python packages (python/) are put on sys.path before the test modules are
imported. pytest loads this file for molgen/tests and everything below it."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
for d in (PYTHON, HERE):
    if d not in sys.path:
        sys.path.insert(0, d)

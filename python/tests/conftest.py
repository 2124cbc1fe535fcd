"""pytest setup and a session summary of the measured errors vs PyTorch.
`import attn` finds python/attn through PYTHONPATH=python (the Makefile's
test-python) or python/pytest.ini's pythonpath; _oracle, beside this file,
through pytest, which puts this folder (no __init__.py) on sys.path."""
import os

import pytest

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")


@pytest.fixture
def restore_threads():
    """Puts the library's thread count back after a test that changes it."""
    import attn
    n = attn.get_num_threads()
    yield
    attn.set_num_threads(0)
    if attn.get_num_threads() != n:
        attn.set_num_threads(n)


def pytest_configure(config):
    try:
        import torch
        torch.set_num_threads(1)  # small problems; shared CPUs
    except ImportError:
        pass


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        import _oracle
    except ImportError:
        return
    tr = terminalreporter
    rows = _oracle.summary_rows()
    fwd = [r for r in rows if not r[0].startswith("grad/")]
    grad = [r for r in rows if r[0].startswith("grad/")]
    if fwd:
        tr.section("attn vs PyTorch: max relative error (max|ours-ref| / max|ref|)")
        width = max(len(r[0]) for r in fwd)
        for label, err, n in fwd:
            tr.write_line("%-*s  %.3e  (%d comparisons)" % (width, label, err, n))
        tr.write_line("%-*s  %.3e  (tolerance %.0e)"
                      % (width, "OVERALL", max(r[1] for r in fwd), _oracle.TOL))
    if grad:
        _grad_tables(tr, grad, _oracle.GRAD_TOL)
    stats = _oracle.stat_rows()
    if stats:
        tr.section("dropout statistics, numeric checks")
        for label, lines in stats:
            for line in lines:
                tr.write_line("%s: %s" % (label, line))


def _grad_tables(tr, rows, tol):
    """One table per group (sdpa, mha): a row per case, a column per
    gradient, each cell the max relative error over that case's calls."""
    tr.section("attn vs PyTorch autograd: gradients, max relative error "
               "(max|ours-ref| / max|ref|)")
    groups = {}
    for label, err, n in rows:
        _, group, case, name = label.split("/", 3)
        g = groups.setdefault(group, {"cols": [], "cells": {}, "n": 0})
        if name not in g["cols"]:
            g["cols"].append(name)
        g["cells"][(case, name)] = err
        g["n"] += n
    overall = 0.0
    for group, g in groups.items():
        cols = g["cols"]
        cases = sorted({c for c, _ in g["cells"]})
        cw = max(len(c) for c in cases + ["MAX", group])
        widths = [max(9, len(c)) for c in cols]
        tr.write_line("")
        tr.write_line("%-*s  " % (cw, group) +
                      "  ".join("%*s" % (w, c) for w, c in zip(widths, cols)))
        for case in cases:
            cells = []
            for w, c in zip(widths, cols):
                e = g["cells"].get((case, c))
                cells.append("%*s" % (w, "-" if e is None else "%.2e" % e))
            tr.write_line("%-*s  " % (cw, case) + "  ".join(cells))
        maxes = []
        for w, c in zip(widths, cols):
            m = max(e for (cs, cn), e in g["cells"].items() if cn == c)
            overall = max(overall, m)
            maxes.append("%*s" % (w, "%.2e" % m))
        tr.write_line("%-*s  " % (cw, "MAX") + "  ".join(maxes))
        tr.write_line("(%d gradient comparisons)" % g["n"])
    tr.write_line("")
    tr.write_line("OVERALL gradients  %.3e  (tolerance %.0e)" % (overall, tol))

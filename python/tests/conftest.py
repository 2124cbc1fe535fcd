"""pytest setup: python/ on sys.path (for `import attn`), tests/ too (for the
oracle helpers), and a session summary of the measured errors vs PyTorch."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
for d in (PYDIR, HERE):
    if d not in sys.path:
        sys.path.insert(0, d)

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")


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
    rows = _oracle.summary_rows()
    if not rows:
        return
    tr = terminalreporter
    tr.section("attn vs PyTorch: max relative error (max|ours-ref| / max|ref|)")
    width = max(len(r[0]) for r in rows)
    for label, err, n in rows:
        tr.write_line("%-*s  %.3e  (%d comparisons)" % (width, label, err, n))
    tr.write_line("%-*s  %.3e  (tolerance %.0e)"
                  % (width, "OVERALL", max(r[1] for r in rows), _oracle.TOL))

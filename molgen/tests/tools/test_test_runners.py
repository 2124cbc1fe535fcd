"""What `make test` runs against what exists: every test file in the tree is
reached by a runner (Makefile's test-python, ctest's C globs and its MPI
groups), and every test of molgen/tests/mpi/test_mpi.py is selected by one
of the MPI groups' -k expressions in molgen/CMakeLists.txt (a test that
matched none was never run, and had failed unseen).
The selection is pytest's own (collection with each -k), not a re-parse."""
import glob
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TESTS = os.path.dirname(HERE)  # molgen/tests: a folder per subject
MPI_TESTS = os.path.join(TESTS, "mpi", "test_mpi.py")


def read(rel):
    with open(os.path.join(REPO, rel)) as f:
        return f.read()


def mpi_selectors():
    """The -k expressions of the MPI groups: set(sel "...") in
    molgen/CMakeLists.txt, one per group of the foreach."""
    text = read("molgen/CMakeLists.txt")
    groups = re.search(r"foreach\(group ([^)]*)\)", text).group(1).split()
    sels = re.findall(r'set\(sel "([^"]*)"\)', text)
    assert len(sels) == len(groups), (groups, sels)
    assert "tests/mpi/test_mpi.py -k ${sel}" in text
    return sels


# Collects MPI_TESTS once per selector in one process (the test module and
# its imports load once) and prints {selector: [node ids]}; "" = all.
COLLECT = r"""
import json, sys, pytest
path, sels = sys.argv[1], json.loads(sys.argv[2])
class Grab:
    ids = []
    def pytest_collection_finish(self, session):
        Grab.ids = [i.nodeid for i in session.items]
out = {}
for sel in [""] + sels:
    Grab.ids = []
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", path] + (["-k", sel] if sel else [])
    rc = pytest.main(args, plugins=[Grab()])
    if rc not in (0, 5):
        sys.exit("collection failed (%d) for -k %r" % (rc, sel))
    out[sel] = Grab.ids
print("COLLECTED " + json.dumps(out))
"""


def test_mpi_groups_select_every_mpi_test():
    sels = mpi_selectors()
    p = subprocess.run([sys.executable, "-c", COLLECT, MPI_TESTS, json.dumps(sels)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = json.loads(p.stdout.split("COLLECTED ", 1)[1])
    every = set(got[""])
    assert len(every) > 10, got[""]
    chosen = set().union(*(set(got[s]) for s in sels))
    assert chosen == every, "not run by any MPI group: %s" % sorted(every - chosen)
    # each test in exactly one group: none runs twice
    for i, a in enumerate(sels):
        for b in sels[i + 1:]:
            assert not set(got[a]) & set(got[b]), (a, b, sorted(set(got[a]) & set(got[b])))


def test_every_test_file_has_a_runner():
    """Every test_*.py / test_*.c under the tree's sources is one the runners
    reach: python/tests (whole directory), molgen/tests/<subject>/test_*.py
    but mpi/ (Makefile's MOLGEN_PY_TESTS), molgen/tests/mpi/test_mpi.py
    (ctest), tests/test_*.c and molgen/tests/<subject>/test_*.c (CMake
    globs); and the Python runner deselects nothing."""
    make = read("Makefile")
    line = next(ln for ln in make.splitlines() if "-m pytest" in ln and "python/tests" in ln)
    for flag in (" -k", "--deselect", "--ignore"):
        assert flag not in line, line
    assert "$(MOLGEN_PY_TESTS)" in line, line
    assert ("MOLGEN_PY_TESTS = $(filter-out molgen/tests/mpi/%,"
            "$(wildcard molgen/tests/*/test_*.py))") in make
    top = read("CMakeLists.txt")
    assert "${PROJECT_SOURCE_DIR}/tests/test_*.c" in top
    assert "${CMAKE_CURRENT_SOURCE_DIR}/tests/*/test_*.c" in read("molgen/CMakeLists.txt")
    reached = set(glob.glob(os.path.join(REPO, "python", "tests", "**", "test_*.py"),
                            recursive=True))
    reached |= set(glob.glob(os.path.join(TESTS, "*", "test_*.py"))) - {MPI_TESTS}
    reached |= {MPI_TESTS}
    reached |= set(glob.glob(os.path.join(REPO, "tests", "test_*.c")))
    reached |= set(glob.glob(os.path.join(TESTS, "*", "test_*.c")))
    found = set()
    skip = {"build", "build-asan", "build-fuzz", ".git", "node_modules", "shared"}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".")]
        for f in files:
            if re.fullmatch(r"test_.*\.(py|c)", f):
                found.add(os.path.join(root, f))
    missing = sorted(os.path.relpath(f, REPO) for f in found - reached)
    assert not missing, "test files no runner reaches: %s" % missing


def test_each_molgen_test_file_imports_alone(tmp_path):
    """Each test file under molgen/tests collects on its own, from another
    directory and without PYTHONPATH (test_mpi.py found molgen_bin only
    through another module's path once): molgen/tests/conftest.py provides
    it. Each file in a process of its own (pytest puts the file's own
    subject folder, not molgen/tests, on sys.path: the case that failed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    files = sorted(glob.glob(os.path.join(TESTS, "**", "test_*.py"), recursive=True))
    assert MPI_TESTS in files
    for f in files:
        p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                            "no:cacheprovider", f], capture_output=True, text=True,
                           timeout=600, cwd=str(tmp_path), env=env)
        assert p.returncode == 0, (os.path.relpath(f, REPO), p.stdout[-4000:] + p.stderr[-2000:])
